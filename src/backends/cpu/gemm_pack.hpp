#pragma once
// Constant GEMM operands packed ahead of time. A MatMul kernel whose B is a
// Param or Constant asks for B in the ISA's panel layout (KernelTable::
// gemm_pack_b); the backend keeps the packed copies next to the param store,
// so clones share them, packs constants once at compile time and repacks a
// param's copies in set_param. Kernels find a copy in the run's pointer table
// at index `n_buffers + operand index`, after the LIR buffers.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/isa.hpp"
#include "backends/cpu/lowp_gemm.hpp"
#include "rlx/compile/lir.hpp"
#include "rlx/runtime/backend.hpp"

namespace rlx::backends::cpu {

// The panel layout of a packed copy: the f32 GEMM's (KernelTable::gemm_pack_b), the int8 or bf16 GEMM's
// (lowp_gemm.hpp), or the direct convolution's blocked weights (KernelTable::conv_pack_weights), whose copies
// are `bytes` long.
// Winograd: the 16 transformed weight matrices U = G g G^T of Winograd F(2x2, 3x3), [Cg, O] each, one after the
// other in the f32 GEMM's panels (packed_floats(isa, K / 9, N) floats each).
enum class PackFormat : std::uint8_t { F32, Int8, Bf16, Conv, Winograd };
struct PackSpec {
  PackFormat format = PackFormat::F32;
  bool source_unsigned = false;  // Int8: the matrix holds u8 (else i8)
  std::size_t bytes = 0;         // Int8, Bf16, Conv, Winograd: the packed copy's size
  std::int64_t groups = 1;       // Conv: N = O output channels in `groups` groups, K = Cg * taps (KH * KW)
  std::int64_t taps = 1;
  bool round_from_f32 = false;  // Bf16: the buffer holds f32, rounded to bf16 as it is packed (a narrowed param)
};

struct PackedOperand {
  compile::BufferId buffer = 0;  // the [K, N] matrix (a Param or Constant buffer, or a view of one)
  std::int64_t K = 0, N = 0;
  bool transposed = false;  // the buffer holds B^T, [N, K]
  PackSpec spec;
};

struct PackRegistry {
  const KernelTable* isa = nullptr;
  const LowpTable* lowp = nullptr;
  std::size_t n_buffers = 0;
  std::vector<PackedOperand> operands;

  // The pointer-table index of `buffer` packed; kernels reading one buffer the same way share its copy.
  std::int32_t request(compile::BufferId buffer, std::int64_t K, std::int64_t N, bool transposed, PackSpec spec = {}) {
    std::size_t i = 0;
    while (i < operands.size() && (operands[i].buffer != buffer || operands[i].transposed != transposed ||
                                   operands[i].spec.format != spec.format))
      ++i;
    if (i == operands.size()) operands.push_back({buffer, K, N, transposed, spec});
    return std::int32_t(n_buffers + i);
  }
};

inline std::size_t packed_floats(const KernelTable& isa, std::int64_t K, std::int64_t N) {
  return std::size_t((N + isa.gemm_nr - 1) / isa.gemm_nr * isa.gemm_nr * K);
}

inline std::size_t packed_bytes(const KernelTable& isa, const PackedOperand& op) {
  return op.spec.format == PackFormat::F32 ? packed_floats(isa, op.K, op.N) * sizeof(float) : op.spec.bytes;
}

// How many packed operands an executable of the CPU backend holds (tests).
std::size_t packed_operand_count(const runtime::ExecutableGraph& exe);
// Each kernel's CpuKernel::strategy(), in run order (tests).
std::vector<std::string> kernel_strategies(const runtime::ExecutableGraph& exe);

}  // namespace rlx::backends::cpu
