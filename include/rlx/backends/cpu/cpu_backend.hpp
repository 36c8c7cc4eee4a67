#pragma once
// The CPU backend ("cpu", Device::Cpu). It registers itself when librlx
// loads; this header is for code that wants it directly (tests, tools).
//
// Kernels come in per-ISA variants (generic, avx2, avx512) picked per CPU at
// compile_lir time; the environment variable RLX_CPU_ISA=generic|avx2|avx512
// overrides the choice (an invalid value is an rlx::Error naming it).
#include <memory>
#include <string>
#include <vector>

#include "rlx/runtime/backend.hpp"

namespace rlx::backends::cpu {

std::unique_ptr<runtime::Backend> make_cpu_backend();

// ISAs this processor can run, best first (always ends with "generic").
std::vector<std::string> available_isas();
// The ISA compile_lir would use now (RLX_CPU_ISA or the best available).
std::string selected_isa();

}  // namespace rlx::backends::cpu
