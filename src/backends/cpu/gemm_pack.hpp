#pragma once
// Constant GEMM operands packed ahead of time. A MatMul kernel whose B is a
// Param or Constant asks for B in the ISA's panel layout (KernelTable::
// gemm_pack_b); the backend keeps the packed copies next to the param store,
// so clones share them, packs constants once at compile time and repacks a
// param's copies in set_param. Kernels find a copy in the run's pointer table
// at index `n_buffers + operand index`, after the LIR buffers.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/cpu/isa.hpp"
#include "rlx/compile/lir.hpp"
#include "rlx/runtime/backend.hpp"

namespace rlx::backends::cpu {

struct PackedOperand {
  compile::BufferId buffer = 0;  // the [K, N] f32 matrix (a Param or Constant buffer, or a view of one)
  std::int64_t K = 0, N = 0;
  bool transposed = false;  // the buffer holds B^T, [N, K]
};

struct PackRegistry {
  const KernelTable* isa = nullptr;
  std::size_t n_buffers = 0;
  std::vector<PackedOperand> operands;

  // The pointer-table index of `buffer` packed; kernels reading one buffer share its copy.
  std::int32_t request(compile::BufferId buffer, std::int64_t K, std::int64_t N, bool transposed) {
    std::size_t i = 0;
    while (i < operands.size() && (operands[i].buffer != buffer || operands[i].transposed != transposed)) ++i;
    if (i == operands.size()) operands.push_back({buffer, K, N, transposed});
    return std::int32_t(n_buffers + i);
  }
};

inline std::size_t packed_floats(const KernelTable& isa, std::int64_t K, std::int64_t N) {
  return std::size_t((N + isa.gemm_nr - 1) / isa.gemm_nr * isa.gemm_nr * K);
}

// How many packed operands an executable of the CPU backend holds (tests).
std::size_t packed_operand_count(const runtime::ExecutableGraph& exe);

}  // namespace rlx::backends::cpu
