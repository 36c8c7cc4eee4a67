// Block-quantized storage (rlx/ir/quants.hpp): dequantize, quantize and the
// matrix product with a block-typed weight, the op a GGUF model's linear layers
// run as. A block type's element values are its blocks dequantized, so the
// float64 references read a block operand's values like any other.
#include <cmath>
#include <string>

#include "ops/family.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/quants.hpp"

namespace rlx::ops {
namespace {

using ir::DType;
using ir::Graph;
using ir::InferArgs;
using ir::Shape;
using ir::TypeInfo;

// The activation rounding of quantized_matmul{activations="q8"}: what the fast kernels feed their
// integer dot products (src/backends/cpu/quant_matmul.hpp). The 32-element weight types take
// Q8_0's quants with an f32 scale, d = amax / 127 and q = round-half-even(x * (1 / d)) clamped
// to [-127, 127]; the K-quants take ggml's Q8_K exactly. In f32, operation by operation.
std::vector<double> q8_row(DType weight, std::span<const double> x) {
  std::vector<float> f(x.begin(), x.end());
  std::vector<double> out(x.size());
  if (ir::block_elems(weight) == 256) {
    for (float v : f)
      if (!std::isfinite(v)) return std::vector<double>(x.size(), std::nan(""));
    std::vector<std::byte> blocks(ir::quantized_bytes(DType::Q8_K, f.size()));
    ir::quantize(DType::Q8_K, f, blocks);
    ir::dequantize(DType::Q8_K, blocks, f);
    for (std::size_t i = 0; i < f.size(); ++i) out[i] = double(f[i]);
    return out;
  }
  for (std::size_t b = 0; b < f.size(); b += 32) {
    float amax = 0;
    for (std::size_t j = b; j < b + 32; ++j) amax = std::fabs(f[j]) > amax ? std::fabs(f[j]) : amax;
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    for (std::size_t j = b; j < b + 32; ++j) {
      const float q = std::nearbyint(f[j] * id);
      out[j] = std::isfinite(q) ? double(d * std::fmax(-127.0f, std::fmin(127.0f, q))) : std::nan("");
    }
  }
  return out;
}

TypeInfo dequantize_infer(const InferArgs& a) {
  a.require(ir::is_block_quantized(a.inputs[0].dtype), "x must be of a block-quantized type");
  return {DType::F32, a.inputs[0].shape};
}

TypeInfo quantize_infer(const InferArgs& a) {
  const DType to = a.attrs.get_dtype("to");
  a.require(ir::is_block_quantized(to), "'to' must be a block-quantized type, got " + std::string(ir::dtype_name(to)));
  a.require(a.inputs[0].dtype == DType::F32, "x must be f32");
  a.require(a.inputs[0].shape.rank() >= 1, "x needs rank >= 1 (blocks run along the last axis)");
  return {to, a.inputs[0].shape};
}

TypeInfo quantized_matmul_infer(const InferArgs& a) {
  const Shape &x = a.inputs[0].shape, &w = a.inputs[1].shape;
  const std::string& act = a.attrs.get_str("activations");
  a.require(act == "f32" || act == "q8", "activations must be \"f32\" or \"q8\", got \"" + act + "\"");
  a.require(a.inputs[0].dtype == DType::F32, "x must be f32");
  a.require(ir::is_block_quantized(a.inputs[1].dtype), "w must be of a block-quantized type");
  a.require(act == "f32" || (a.inputs[1].dtype != DType::Q8_1 && a.inputs[1].dtype != DType::Q8_K),
            "q8 activations take a weight of q4_0, q4_1, q5_0, q5_1, q8_0 or q2_k ... q6_k; " +
                std::string(ir::dtype_name(a.inputs[1].dtype)) + " is an activation format (use \"f32\")");
  a.require(w.rank() == 2, "w must be [N, K]");
  a.require(x.rank() >= 1, "x needs rank >= 1");
  a.require(x[x.rank() - 1] == w[1],
            "contraction dims differ (x's " + x[x.rank() - 1].str() + " vs w's " + w[1].str() + ")");
  auto dims = x.dims();
  dims.back() = w[0];
  return {DType::F32, Shape(std::move(dims))};
}

F64Value dequantize_reference(const ReferenceArgs& c) {
  F64Value r = c.result(c.x(0).ext);
  r.v = c.x(0).v;  // a block operand's values are its dequantized blocks
  return r;
}

// The value quantize's blocks dequantize to: the rows quantized together, as rlx::ir::quantize.
F64Value quantize_reference(const ReferenceArgs& c) {
  const F64Value& x = c.x(0);
  F64Value r = c.result(x.ext);
  std::vector<float> f(x.v.begin(), x.v.end());
  for (std::size_t i = 0; i < f.size(); ++i)
    if (!std::isfinite(f[i]))
      c.fail("element " + std::to_string(i) + " is not finite (block types hold finite values)");
  std::vector<std::byte> blocks(ir::quantized_bytes(c.n.dtype, f.size()));
  ir::quantize(c.n.dtype, f, blocks);
  ir::dequantize(c.n.dtype, blocks, f);
  r.v.assign(f.begin(), f.end());
  return r;
}

F64Value quantized_matmul_reference(const ReferenceArgs& c) {
  const F64Value &x = c.x(0), &w = c.x(1);
  const std::int64_t K = w.ext[1], N = w.ext[0], M = K ? numel(x.ext) / K : 0;
  const bool q8 = c.attrs().get_str("activations") == "q8";
  const DType wt = c.in.size() > 1 ? c.x(1).dtype : DType::F32;
  Extents out = x.ext;
  out.back() = N;
  F64Value r = c.result(out);
  for (std::int64_t m = 0; m < M; ++m) {
    std::span<const double> row(x.v.data() + m * K, std::size_t(K));
    const std::vector<double> xq = q8 ? q8_row(wt, row) : std::vector<double>(row.begin(), row.end());
    for (std::int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (std::int64_t k = 0; k < K; ++k) acc += xq[std::size_t(k)] * w.v[std::size_t(n * K + k)];
      r.v[std::size_t(m * N + n)] = acc;
    }
  }
  return r;
}

// x w^T with w dequantized; for "q8", x rounded per block first, in primitives (q8_row's steps) for the
// 32-element types and through Q8_K's blocks for the K-quants.
NodeId quantized_matmul_decompose(const ir::DecomposeArgs& a) {
  Graph& g = a.g;
  NodeId x = a.in[0], w = a.in[1];
  const DType wt = g.node(w).dtype;
  if (a.attrs().get_str("activations") == "q8") {
    const Shape xs = g.node(x).shape;
    if (ir::block_elems(wt) == 256) {
      x = g.dequantize(g.quantize(x, DType::Q8_K));
    } else {
      if (!xs.is_static())
        throw Error("quantized_matmul{activations=q8}: the decomposition needs a static x, got " + xs.str());
      auto blocks = xs.extents();
      blocks.back() /= 32;
      blocks.push_back(32);
      NodeId xb = g.reshape(x, Shape(blocks));
      NodeId d = g.div(g.reduce(OpKind::ReduceMax, g.unary(OpKind::Abs, xb), {-1}, true), g.scalar(127.0, DType::F32));
      NodeId zero = g.scalar(0.0, DType::F32);
      NodeId id = g.where(g.binary(OpKind::Eq, d, zero), zero, g.div(g.scalar(1.0, DType::F32), d));
      NodeId q = g.clamp(g.unary(OpKind::Round, g.mul(xb, id)), -127, 127);
      x = g.reshape(g.mul(q, d), xs);
    }
  }
  NodeId wf = g.permute(g.dequantize(w), {1, 0});
  const Shape xs = g.node(x).shape;
  if (xs.rank() == 1)
    return g.reshape(g.matmul(g.reshape(x, Shape(std::vector<ir::Dim>{ir::Dim(1), xs[0]})), wf),
                     Shape(std::vector<ir::Dim>{g.node(wf).shape[1]}));
  return g.matmul(x, wf);
}

double quantized_matmul_flops(std::span<const TypeInfo> in, const TypeInfo& out) {
  const Shape& w = in[1].shape;
  return 2 * ir::estimated_numel(out.shape) * (w[1].is_static() ? double(w[1].size) : 1.0);
}

// The same op on the batched operand: blocks run along the last axis, which the batch axis leaves alone.
BatchedValue same_op_batched(const BatchArgs& a) {
  if (a.x.size() > 1 && a.x[1].batched) return a.decomposed();
  std::vector<NodeId> ins;
  for (std::size_t k = 0; k < a.x.size(); ++k) ins.push_back(k == 0 ? a.lifted(0) : a.x[k].id);
  return BatchArgs::out(a.g.add(a.n.op, std::move(ins), a.n.attrs));
}

}  // namespace
}  // namespace rlx::ops

RLX_OP_FAMILY(quant) {
  using namespace rlx::ops;
  using rlx::ir::define_op;
  define_op({.kind = OpKind::Dequantize,
             .doc = "a block-quantized tensor's values as f32 (bit for bit as gguf.quants.dequantize)",
             .operands = {"x"},
             .storage_operands = {0},
             .infer = dequantize_infer,
             .reference = dequantize_reference,
             .vmap = same_op_batched,
             .flops_per_element = 2});
  define_op({.kind = OpKind::Quantize,
             .doc = "f32 rows quantized per block to `to` (ggml's reference quantizers)",
             .operands = {"x"},
             .attrs = {{"to", T::DType, true}},
             .infer = quantize_infer,
             .reference = quantize_reference,
             .vmap = same_op_batched,
             .flops_per_element = 4});
  define_op({.kind = OpKind::QuantizedMatmul,
             .doc = "x [.., K] times the rows of a block-quantized w [N, K]: [.., N]",
             .operands = {"x", "w"},
             .storage_operands = {1},
             .attrs = {{"activations", T::String, false, std::string("f32")}},
             .infer = quantized_matmul_infer,
             .decompose = quantized_matmul_decompose,
             .reference = quantized_matmul_reference,
             .vmap = same_op_batched,
             .flops = quantized_matmul_flops});
}
