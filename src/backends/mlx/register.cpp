// Registers the MLX backend at load time: its traits and modes, with or
// without MLX. Built without MLX, the backend still registers, as unavailable
// with that reason.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "rlx/backends/mlx/mlx_backend.hpp"
#ifdef RLX_HAVE_MLX
#include "rlx/backends/mlx/mlx_kernel.hpp"
#endif
#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/op_def.hpp"
#include "rlx/runtime/custom_kernels.hpp"

namespace rlx::backends::mlx {

compile::BackendTraits traits() {
  using ir::OpKind;
  compile::BackendTraits t;
  t.name = "mlx";
  // The primitives lower.cpp maps onto mlx::core, listed one by one: an op added later is not claimed until it
  // has a lowering (it takes the host tier). Formula ops (sigmoid, gelu, ...) and composites run as their
  // primitives, which mx::compile fuses again. Random samples are not claimed: RLX's counter-based streams
  // must match every backend's, so the CPU backend draws them.
  for (OpKind op : {OpKind::Input,       OpKind::Param,      OpKind::Constant,  OpKind::Iota,      OpKind::Neg,
                    OpKind::Abs,         OpKind::Exp,        OpKind::Log,       OpKind::Sqrt,      OpKind::Rsqrt,
                    OpKind::Reciprocal,  OpKind::Tanh,       OpKind::Relu,      OpKind::Erf,       OpKind::Sin,
                    OpKind::Cos,         OpKind::Floor,      OpKind::Ceil,      OpKind::Round,     OpKind::Sign,
                    OpKind::Not,         OpKind::Add,        OpKind::Sub,       OpKind::Mul,       OpKind::Div,
                    OpKind::Pow,         OpKind::Max,        OpKind::Min,       OpKind::Mod,       OpKind::Eq,
                    OpKind::Ne,          OpKind::Lt,         OpKind::Le,        OpKind::Gt,        OpKind::Ge,
                    OpKind::And,         OpKind::Or,         OpKind::Where,     OpKind::Cast,      OpKind::Clamp,
                    OpKind::ReduceSum,   OpKind::ReduceMean, OpKind::ReduceMax, OpKind::ReduceMin, OpKind::ReduceProd,
                    OpKind::ArgMax,      OpKind::ArgMin,     OpKind::MatMul,    OpKind::Reshape,   OpKind::Permute,
                    OpKind::Expand,      OpKind::Slice,      OpKind::Concat,    OpKind::Pad,       OpKind::Gather,
                    OpKind::IndexSelect, OpKind::ScatterAdd, OpKind::Squeeze,   OpKind::Unsqueeze, OpKind::Flip})
    t.native_ops.insert(op);
  // The dtypes lower.cpp maps onto MLX's; a kernel with any other (i16, u16, u32, u64, the storage-only types)
  // takes the host tier (host_reason).
  t.native_dtypes = {ir::DType::F32, ir::DType::F16, ir::DType::BF16, ir::DType::F64, ir::DType::I8,
                     ir::DType::U8,  ir::DType::I32, ir::DType::I64,  ir::DType::Bool};
  // Composites MLX has a kernel for, each lowered with the op table's exact semantics (lower.cpp): softmax onto
  // mx::softmax, the norms onto mx::fast, attention onto mx::fast::scaled_dot_product_attention, convolutions onto
  // mx::conv_general (channels-last, through transposes). Rope is not: mx::fast::rope computes its angles from
  // positions and a base, where RLX's takes cos and sin as operands.
  for (OpKind op :
       {OpKind::Softmax, OpKind::LayerNorm, OpKind::RmsNorm, OpKind::Attention, OpKind::Conv1d, OpKind::Conv2d})
    t.native_ops.insert(op);
  // Execution is f32 (the seed's): f16 and bf16 values are stored as they are and every op but casts and those
  // that only move values gets casts to f32 around it, as on CUDA.
  for (OpKind op : t.native_ops)
    if ((ir::op_info(op).cls != ir::OpClass::Movement || op == OpKind::ScatterAdd) && op != OpKind::Cast)
      t.f32_compute_ops.insert(op);
  t.host_fallback = true;
  for (auto& n : runtime::host_kernel_names()) t.custom_kernels.insert(std::move(n));
#ifdef RLX_HAVE_MLX
  for (auto& n : mlx_kernel_names()) t.custom_kernels.insert(std::move(n));  // register_mlx_kernel
#endif
  return t;
}

std::string_view mode_name(Mode m) {
  switch (m) {
    case Mode::Eager: return "eager";
    case Mode::Lazy: return "lazy";
    case Mode::Compiled: return "compiled";
  }
  return "compiled";
}

Mode parse_mode(std::string_view name) {
  std::string s(name);
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  for (Mode m : {Mode::Eager, Mode::Lazy, Mode::Compiled})
    if (s == mode_name(m)) return m;
  throw Error(fmt::format("RLX_MLX_MODE='{}' is not a mode (eager, lazy or compiled)", name));
}

Mode mode_from_env() {
  auto v = env::get("RLX_MLX_MODE");
  return v ? parse_mode(*v) : Mode::Compiled;
}

#ifndef RLX_HAVE_MLX
namespace {
constexpr const char* kNotBuilt =
    "built without MLX (RLX_MLX=OFF, a sanitizer build, or no MLXConfig.cmake from PyPI's mlx-cpu in .venv at "
    "configure time: run scripts/bootstrap.sh)";
}  // namespace

std::unique_ptr<runtime::Backend> make_mlx_backend() {
  return runtime::make_unavailable_backend("mlx", mlx::traits(), kNotBuilt);
}
std::string unavailable_reason() { return kNotBuilt; }
#endif

namespace {
[[maybe_unused]] const bool registered =
    (runtime::register_backend(runtime::Device::Mlx, [] { return make_mlx_backend(); }), true);
}  // namespace

}  // namespace rlx::backends::mlx
