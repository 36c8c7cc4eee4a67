#include "backends/cpu/lowp_gemm.hpp"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "rlx/env.hpp"
#include "rlx/error.hpp"

namespace rlx::backends::cpu {

namespace {

bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
bool cpu_has_avx512lowp() {
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16");
}

// AMX needs the CPU's AMX-BF16 and AMX-INT8 (every AMX CPU so far has both, so one table holds both kernels)
// and the kernel's leave: Linux hands a process the tiles' 8 KiB of state only
// after arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) (Linux 5.16 and later; a VM may refuse). Asked once.
bool cpu_has_avx512amx() {
  static const bool granted = [] {
    // CPUID leaf 7: EDX bit 24 AMX-TILE, bit 22 AMX-BF16, bit 25 AMX-INT8 (read directly: clang 14's
    // __builtin_cpu_supports does not know them).
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!cpu_has_avx512lowp() || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !(edx & (1u << 24)) ||
        !(edx & (1u << 22)) || !(edx & (1u << 25)))
      return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
}

}  // namespace

std::vector<std::string> lowp_isas() {
  std::vector<std::string> out;
  if (cpu_has_avx512amx()) out.emplace_back("avx512amx");
  if (cpu_has_avx512lowp()) out.emplace_back("avx512lowp");
  if (cpu_has_avx2()) out.emplace_back("avx2");
  out.emplace_back("generic");
  return out;
}

const LowpTable& lowp_table(std::string_view isa) {
  if (isa == "generic") return generic::lowp_table();
  if (isa == "avx2" && cpu_has_avx2()) return avx2::lowp_table();
  if (isa == "avx512lowp" && cpu_has_avx512lowp()) return avx512lowp::lowp_table();
  if (isa == "avx512amx" && cpu_has_avx512amx()) return avx512amx::lowp_table();
  if (isa == "avx2" || isa == "avx512lowp" || isa == "avx512amx")
    throw Error("low-precision GEMM: CPU ISA '" + std::string(isa) + "' is not supported by this processor");
  throw Error("low-precision GEMM: unknown ISA '" + std::string(isa) +
              "' (expected generic, avx2, avx512lowp or avx512amx)");
}

bool bf16_beats_f32(const LowpTable& table) {
  if (table.bf16_beats_f32) return true;
  if (table.bf16_nr == 0 || std::string_view(table.name) != "avx512lowp") return false;
  static const bool amd = [] {
    unsigned eax = 0, vendor[3] = {};  // CPUID leaf 0: the vendor string in EBX, EDX, ECX
    if (!__get_cpuid(0, &eax, &vendor[0], &vendor[2], &vendor[1])) return false;
    return std::string_view(reinterpret_cast<const char*>(vendor), sizeof vendor) == "AuthenticAMD";
  }();
  return amd;
}

const LowpTable& select_lowp_table() {
  auto want = env::get("RLX_CPU_ISA");
  if (want && *want == "generic") return generic::lowp_table();
  if (want && *want == "avx2") return lowp_table("avx2");
  return lowp_table(lowp_isas().front());  // avx512 (or no choice): the best this CPU has
}

}  // namespace rlx::backends::cpu
