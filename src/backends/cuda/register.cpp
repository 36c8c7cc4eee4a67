// Registers the CUDA backend at load time. Built without the CUDA headers, the
// backend still registers, as unavailable with that reason.
#include "backends/cuda/conv.hpp"
#include "backends/cuda/layout.hpp"
#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/codegen/c.hpp"
#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/op_def.hpp"
#include "rlx/runtime/custom_kernels.hpp"

namespace rlx::backends::cuda {

compile::BackendTraits traits() {
  compile::BackendTraits t = codegen::c::traits();
  t.name = "cuda";
  // f16 and bf16 are stored as they are and computed in f32: every op but casts and those that only move
  // values gets casts to f32 around it, which fuse into its kernel.
  t.native_dtypes.insert({ir::DType::F16, ir::DType::BF16});
  // Convolutions stay whole where cuDNN runs them (conv.hpp); otherwise they decompose into matmuls.
  if (cudnn_convolutions())
    for (ir::OpKind op : {ir::OpKind::Conv1d, ir::OpKind::Conv2d}) t.native_ops.insert(op);
  // Softmax and the norms stay whole: one phase a row op, a warp per row (codegen::c's CUDA dialect), where
  // their decompositions take three kernels and three trips through memory.
  for (ir::OpKind op : {ir::OpKind::Softmax, ir::OpKind::LogSoftmax, ir::OpKind::LayerNorm, ir::OpKind::RmsNorm})
    t.native_ops.insert(op);
  // Rope stays whole too: one phase over the pairs (codegen::c's CUDA dialect), where its decomposition takes ten
  // kernels; a decoder layer has two.
  t.native_ops.insert(ir::OpKind::Rope);
  // Attention stays whole for the flash-attention kernel (attention.hpp), which computes in f32 (f16 and bf16
  // through casts, below); f64 attention decomposes, and every attention with RLX_CUDA_FLASH_ATTENTION=0.
  if (env::get_bool("RLX_CUDA_FLASH_ATTENTION")) {
    t.native_ops.insert(ir::OpKind::Attention);
    t.native_ops.only_at[ir::OpKind::Attention] = {ir::DType::F32, ir::DType::F16, ir::DType::BF16};
    // It reads q, k and v and writes its result through [B, S, H, D] <-> [B, H, S, D] permutes (strides), so a
    // transformer's head split and merge cost no movement kernels.
    t.attention_layout_views = true;
  }
  for (ir::OpKind op : t.native_ops)
    if ((ir::op_info(op).cls != ir::OpClass::Movement || op == ir::OpKind::ScatterAdd) && op != ir::OpKind::Cast)
      t.f32_compute_ops.insert(op);
  // GGUF's block types (quant.hpp): quantized_matmul stays whole for the GEMV that dequantizes in registers
  // (decomposed, it would dequantize the whole weight to memory on every run), dequantize runs on the device,
  // and embedding gathers a block table's rows without dequantizing the table (its decomposition's
  // index_select(dequantize(table))). Added after the f32-compute set: an embedding of a bf16 or f16 table
  // copies the rows as they are, with no cast of the whole table.
  for (ir::OpKind op : {ir::OpKind::QuantizedMatmul, ir::OpKind::Dequantize, ir::OpKind::Embedding})
    t.native_ops.insert(op);
  // A KV cache's update is one phase (codegen::c's CUDA dialect) instead of its decomposition's four kernels; it
  // copies values as they are, so it is no f32-compute op either.
  t.native_ops.insert(ir::OpKind::DynamicUpdateSlice);
  // bf16 and f16 matmuls read their operands as stored (cuBLASLt's bf16/f16 GEMMs with f32 accumulation), and a
  // transposed B (a linear layer's [out, in] weight) with cuBLASLt's op T instead of a transpose kernel a run.
  t.matmul_widened_operands = true;
  t.matmul_transposed_b = true;
  // What the precision pass may lower: cuBLASLt's bf16 and f16 GEMMs run on tensor cores, many times f32's rate.
  t.fast_low_precision = {{ir::OpKind::MatMul, ir::DType::BF16}, {ir::OpKind::MatMul, ir::DType::F16}};
  t.host_fallback = true;
  for (auto& n : runtime::cuda_kernel_names()) t.custom_kernels.insert(std::move(n));
  for (auto& n : runtime::host_kernel_names()) t.custom_kernels.insert(std::move(n));
  t.arena_alignment = std::int64_t(kArenaAlignment);
  return t;
}

#ifndef RLX_HAVE_CUDA
namespace {
constexpr const char* kNotBuilt =
    "built without CUDA support (RLX_CUDA=OFF, or no CUDA toolkit headers (cuda.h, nvrtc.h, cublasLt.h) at build time)";
}  // namespace

std::unique_ptr<runtime::Backend> make_cuda_backend() {
  return runtime::make_unavailable_backend("cuda", cuda::traits(), kNotBuilt);
}
std::string unavailable_reason() { return kNotBuilt; }
DeviceInfo selected_device() { throw Error(std::string("cuda: ") + kNotBuilt); }
std::size_t compile_for_arch(const std::string&, const std::string&) { throw Error(std::string("cuda: ") + kNotBuilt); }
std::string nvrtc_unavailable_reason() { return kNotBuilt; }
std::string compile_custom_kernel(std::string_view, const std::string&) {
  throw Error(std::string("cuda: ") + kNotBuilt);
}
double copy_bandwidth_gbps(std::uint64_t, int) { throw Error(std::string("cuda: ") + kNotBuilt); }
#endif

namespace {
[[maybe_unused]] const bool registered =
    (runtime::register_backend(runtime::Device::Cuda, [] { return make_cuda_backend(); }), true);
}  // namespace

}  // namespace rlx::backends::cuda
