#pragma once
// The int8 matmul's fused tail. PTQ leaves each int8 matmul kernel's epilogue a per-column affine chain on the
// i32 accumulator: dequantize (cast to f32, minus the zero point's column term, times the scales), bias and
// activation, and where quant_propagate folded the next layer's quantize in, round, clamp and a cast to u8
// (docs/precision.md). Run by the generic epilogue program, those few flops cost more than a small GEMM
// (several passes over the tile, each through an interpreted instruction); matched here at build time, they
// run in the int8 GEMM's store instead (LowpTable::i8_epilogue): one vectorized pass from the i32 tile to the
// output, bit for bit the program's result. RLX_CPU_INT8_EPILOGUE=0 keeps the program, to compare the two.
#include <memory>
#include <optional>
#include <vector>

#include "backends/cpu/kernels.hpp"
#include "backends/cpu/lowp_gemm.hpp"

namespace rlx::backends::cpu {

struct Int8Chain {
  static constexpr int kMaxSteps = 16;  // PTQ's longest chain has six
  // The steps, their column operands resolved at run time: a constant's data (kept alive by `constants`), or
  // a kernel input buffer (a bias param) by id.
  std::vector<I8EpiStep> steps;
  std::vector<compile::BufferId> step_buf;  // per step: the operand's buffer, or -1
  std::vector<std::shared_ptr<const ir::Tensor>> constants;
  I8Epilogue::Out out = I8Epilogue::F32;
  compile::BufferId out_buf = 0;

  // The steps with their run's operands, into `scratch` (at least steps.size() long); dst is out_buf's data.
  I8Epilogue bind(const RunCtx& c, I8EpiStep* scratch) const;
};

// The chain from matmul `mm` to the kernel's one output, when every op on it is one the fused store computes
// (cast to f32; add, sub, mul, div, max and min with a scalar constant or a per-column f32 vector; relu;
// round; clamp; a final cast to u8 or i8 after a clamp within its range) and each feeds only the next;
// nullopt otherwise, and always when RLX_CPU_INT8_EPILOGUE=0.
std::optional<Int8Chain> match_int8_chain(const BuildCtx& b, const ir::Node& mm);

// A standalone quantize (an elementwise kernel from one f32 input to a u8 or i8 output of its shape through
// the same steps, such as PTQ's `cast(clamp(round(x * 1/s + zp)))`) as a kernel that runs the chain through
// `table`'s i8_epilogue; null when the body is not one, and always when RLX_CPU_INT8_EPILOGUE=0.
std::unique_ptr<CpuKernel> build_quantize_chain(const BuildCtx& b, const LowpTable& table);

}  // namespace rlx::backends::cpu
