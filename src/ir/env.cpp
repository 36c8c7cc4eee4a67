#include "rlx/env.hpp"

#include <algorithm>
#include <cassert>
#include <cstdlib>

#include "rlx/error.hpp"

namespace rlx::env {

const std::vector<Var>& catalog() {
  static const std::vector<Var> vars{
      {"RLX_DUMP", Type::List, "",
       "Print the IR to stderr after the named passes (comma separated), or at a level: hir, mir, lir, all. "
       "CompileOptions::dump overrides it."},
      {"RLX_CPU_ISA", Type::String, "",
       "Force the CPU kernels' instruction set: generic, avx2 or avx512. Unset = the best the CPU supports."},
      {"RLX_CPU_GEMM", Type::String, "",
       "Force the CPU f32 GEMM for constant weights: packed (RLX's packed-B kernel) or blas (OpenBLAS). "
       "Unset = chosen by shape, from measurements; for tests and benchmarks."},
      {"RLX_TEST_SEED", Type::Int, "",
       "Seed for the tests' random inputs and graphs (printed by every test run), to replay a failure."},
  };
  return vars;
}

namespace {
const Var& declared(std::string_view name) {
  const auto& vars = catalog();
  auto it = std::find_if(vars.begin(), vars.end(), [&](const Var& v) { return v.name == name; });
  assert(it != vars.end() && "read an RLX_* variable that is not declared in src/ir/env.cpp");
  return *it;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

std::optional<std::string> get(std::string_view name) {
  const Var& v = declared(name);
  const char* raw = std::getenv(std::string(v.name).c_str());
  if (raw && *raw) return std::string(raw);
  if (!v.default_value.empty()) return std::string(v.default_value);
  return std::nullopt;
}

std::optional<long long> get_int(std::string_view name) {
  auto s = get(name);
  if (!s) return std::nullopt;
  try {
    std::size_t used = 0;
    long long v = std::stoll(*s, &used);
    if (used == s->size()) return v;
  } catch (const std::exception&) {
  }
  throw Error("environment variable " + std::string(name) + "='" + *s + "' is not an integer");
}

bool get_bool(std::string_view name) {
  auto s = get(name);
  if (!s) return false;
  auto v = lower(*s);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  throw Error("environment variable " + std::string(name) + "='" + *s + "' is not a boolean (use 1/0, true/false)");
}

std::vector<std::string> get_list(std::string_view name) {
  std::vector<std::string> out;
  auto s = get(name);
  if (!s) return out;
  std::size_t start = 0;
  while (start <= s->size()) {
    auto end = s->find(',', start);
    if (end == std::string::npos) end = s->size();
    auto item = s->substr(start, end - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
    start = end + 1;
  }
  return out;
}

std::string catalog_markdown() {
  static constexpr std::string_view kType[] = {"string", "int", "bool", "list"};
  std::string s =
      "# Environment variables\n\n"
      "Generated from the table in `src/ir/env.cpp` by `rlx env --markdown`; "
      "`tests/docs/test_generated_docs.cpp` fails when this file drifts. "
      "RLX reads no other `RLX_*` variable, and the best settings are the defaults: none is needed for speed.\n\n"
      "| variable | type | default | what it does |\n|---|---|---|---|\n";
  for (const auto& v : catalog())
    s += "| `" + std::string(v.name) + "` | " + std::string(kType[static_cast<int>(v.type)]) + " | " +
         (v.default_value.empty() ? std::string("unset") : "`" + std::string(v.default_value) + "`") + " | " +
         std::string(v.doc) + " |\n";
  return s;
}

}  // namespace rlx::env
