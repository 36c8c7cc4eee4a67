#pragma once
// Compares what rlx::gguf reads from a file with what gguf-py's GGUFReader
// reads from it (tests/gguf/gguf_py_dump.py): keys in order, value types and
// leaf values as GGUFReader flattens them, tensor names, types, dims, data
// offsets, sizes and CRC-32s.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "gguf/gguf_test_util.hpp"
#include "rlx/gguf/gguf.hpp"

namespace rlx::gguf::testing {

// GGUFReader's `types` of a field: the value's type, then, for a non-empty array, its element's types (from the
// first element down).
inline void py_array_types(const Array& a, nlohmann::json& types) {
  if (a.empty()) return;
  types.push_back(static_cast<int>(a.elem_type()));
  if (a.elem_type() == ValueType::Array) py_array_types(a.as<Array>().front(), types);
}

inline std::string hex(const std::string& s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

// GGUFReader's leaves: every scalar and string of the value, nested arrays flattened.
inline void py_leaves(const Array& a, nlohmann::json& out) {
  std::visit(
      [&](const auto& items) {
        using T = typename std::decay_t<decltype(items)>::value_type;
        for (const auto& x : items) {
          if constexpr (std::is_same_v<T, Array>)
            py_leaves(x, out);
          else if constexpr (std::is_same_v<T, std::string>)
            out.push_back(hex(x));
          else if constexpr (std::is_same_v<T, float>)
            out.push_back(static_cast<double>(x));
          else
            out.push_back(static_cast<T>(x));
        }
      },
      a.storage());
}

inline nlohmann::json py_view(const Value& v) {
  nlohmann::json types = nlohmann::json::array(), leaves = nlohmann::json::array();
  types.push_back(static_cast<int>(v.type()));
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Array>) {
          py_array_types(x, types);
          py_leaves(x, leaves);
        } else if constexpr (std::is_same_v<T, std::string>) {
          leaves.push_back(hex(x));
        } else if constexpr (std::is_same_v<T, float>) {
          leaves.push_back(static_cast<double>(x));
        } else {
          leaves.push_back(x);
        }
      },
      v.storage());
  return {{"types", types}, {"leaves", leaves}};
}

// Runs gguf_py_dump.py on the file; skips the test (with the reason) when there is no Python with gguf.
inline nlohmann::json gguf_py_dump(const std::filesystem::path& path) {
  std::string why;
  auto py = python_with_gguf(why);
  if (!py) return nullptr;
  const std::string script = std::string(RLX_SOURCE_DIR) + "/tests/gguf/gguf_py_dump.py";
  auto out = run_capture(shell_quote(*py) + " " + shell_quote(script) + " " + shell_quote(path.string()));
  if (!out) {
    ADD_FAILURE() << "gguf_py_dump.py failed on " << path;
    return nullptr;
  }
  return nlohmann::json::parse(*out);
}

inline void expect_matches_gguf_py(const File& f, const nlohmann::json& py) {
  EXPECT_EQ(py["version"], f.version());
  const auto& fields = py["fields"];
  ASSERT_EQ(fields.size(), f.metadata().size());
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const auto& kv = f.metadata().entries()[i];
    EXPECT_EQ(fields[i]["key"], kv.key) << "entry " << i;
    const auto ours = py_view(kv.value);
    EXPECT_EQ(fields[i]["types"], ours["types"]) << kv.key;
    EXPECT_EQ(fields[i]["leaves"], ours["leaves"]) << kv.key;
  }
  const auto& tensors = py["tensors"];
  ASSERT_EQ(tensors.size(), f.tensors().size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = f.tensors()[i];
    EXPECT_EQ(tensors[i]["name"], t.name);
    EXPECT_EQ(tensors[i]["type"], static_cast<int>(t.type)) << t.name;
    EXPECT_EQ(tensors[i]["dims"], nlohmann::json(t.dims)) << t.name;
    EXPECT_EQ(tensors[i]["offset"], t.file_offset) << t.name;
    EXPECT_EQ(tensors[i]["nbytes"], t.nbytes) << t.name;
    EXPECT_EQ(tensors[i]["crc32"], crc32(f.data(t))) << t.name;
  }
}

}  // namespace rlx::gguf::testing
