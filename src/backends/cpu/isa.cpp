#include "backends/cpu/isa.hpp"

#include <cstdlib>

#include "rlx/env.hpp"
#include "rlx/error.hpp"

namespace rlx::backends::cpu {

namespace {

bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

// The one place RLX_CPU_ISA is read; empty when unset.
std::string isa_override() {
  auto value = env::get("RLX_CPU_ISA");
  if (!value) return {};
  const std::string& v = *value;
  if (v != "generic" && v != "avx2" && v != "avx512")
    throw Error("RLX_CPU_ISA='" + v + "' is not one of generic, avx2, avx512");
  return v;
}

}  // namespace

std::vector<std::string> supported_isas() {
  std::vector<std::string> out;
  if (cpu_has_avx512()) out.emplace_back("avx512");
  if (cpu_has_avx2()) out.emplace_back("avx2");
  out.emplace_back("generic");
  return out;
}

const KernelTable& kernel_table(std::string_view isa) {
  if (isa == "generic") return generic::table();
  if (isa == "avx2" && cpu_has_avx2()) return avx2::table();
  if (isa == "avx512" && cpu_has_avx512()) return avx512::table();
  if (isa == "avx2" || isa == "avx512")
    throw Error("CPU ISA '" + std::string(isa) + "' is not supported by this processor");
  throw Error("unknown CPU ISA '" + std::string(isa) + "' (expected generic, avx2 or avx512)");
}

const KernelTable& select_kernels() {
  std::string want = isa_override();
  if (want.empty()) return kernel_table(supported_isas().front());
  try {
    return kernel_table(want);
  } catch (const Error& e) {
    throw Error(std::string("RLX_CPU_ISA: ") + e.what());
  }
}

}  // namespace rlx::backends::cpu
