#pragma once
// The CUDA backend's kernels for GGUF's block-quantized types (issue 15, "SmolLM2 decode on the GPU"): the
// Native kernels the traits keep whole (quantized_matmul, dequantize, embedding), as hand-written CUDA C in
// a program per block type (so a model compiles only its types' kernels), compiled by NVRTC through the cubin
// cache once per process.
//
// - quantized_matmul: a warp per output column n of w [N, K] (4 warps a block, grid-stride over N). Each lane
//   dequantizes 8 weights at a time in registers (quant_code.inc's parts; a 32-element block is 4 lanes' work,
//   a 256-element one the warp's), multiplies them with up to 8 rows of x at once (f32 accumulation), and a
//   shuffle butterfly sums the lanes. Rows beyond 8 run in further passes over the weight row, which then
//   comes from L2. activations="q8" rounds each x value as q8_row does (src/ops/quant.cpp), the block's
//   largest magnitude found with shuffles across the lanes that hold the block.
// - dequantize: a thread per 8 elements (a part), grid-stride.
// - embedding: a thread per part of each picked row for a block table (the rows come out dequantized), a
//   thread per element for the other types (the row copied as it is); ids wrap once when negative and are
//   clamped to the table, as the generated index_select does.
// Needs no GPU: plan_quant and quant_program are what tests compile.
#include <cstdint>
#include <string>
#include <vector>

#include "rlx/compile/lir.hpp"

namespace rlx::backends::cuda {

// The program holding the kernels of block type `t` (rlx_qmm_<t>, rlx_deq_<t>, rlx_emb_<t>), or for any other
// type the embedding kernels that copy rows as they are (rlx_emb_b1 .. rlx_emb_b8). The same text each call.
const std::string& quant_program(ir::DType t);

// One launch of a function of quant_program(program): its operands are LIR buffers (inputs, then the output), then
// the 64-bit scalars, in the order the function declares them.
struct QuantLaunch {
  std::string entry;
  ir::DType program = ir::DType::F32;  // the quant_program it is in
  unsigned grid = 1, block = 1;
  std::vector<compile::BufferId> buffers;
  std::vector<std::int64_t> scalars;
};

// The launch that runs Native kernel `k`, when it holds one quantized_matmul, dequantize or embedding as its
// output; otherwise false with the reason in *why (the kernel then runs on the host).
bool plan_quant(const compile::LirModule& lir, const compile::Kernel& k, QuantLaunch* out, std::string* why);

}  // namespace rlx::backends::cuda
