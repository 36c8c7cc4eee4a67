#include "backends/cuda/gemm_shape.hpp"

#include <algorithm>
#include <limits>
#include <vector>

#include "rlx/env.hpp"

namespace rlx::backends::cuda {

namespace {

// The kernel's rest as cuBLASLt's epilogue: from its one output back to the product, an optional relu, then
// adds of one Input each, a row of n (the bias) or the product's shape (the residual), at most one of each, and
// nothing else computed in the body.
std::optional<GemmEpilogue> gemm_epilogue(const compile::Kernel& kernel, const ir::Node& mm, std::int64_t n) {
  const auto& body = kernel.body;
  if (body.outputs().size() != 1 || mm.dtype != ir::DType::F32) return std::nullopt;
  GemmEpilogue e;
  const ir::Node* at = &body.node(body.outputs()[0].node);
  std::size_t chain = 0;  // the nodes after the product, the output included
  if (at->op == ir::OpKind::Relu) {
    e.relu = true;
    at = &body.node(at->inputs[0]);
    ++chain;
  }
  while (at->id != mm.id) {
    if (at->op != ir::OpKind::Add || at->dtype != ir::DType::F32 || at->shape != mm.shape) return std::nullopt;
    const auto& x = body.node(at->inputs[0]);
    const auto& y = body.node(at->inputs[1]);
    if ((x.op == ir::OpKind::Input) == (y.op == ir::OpKind::Input)) return std::nullopt;  // one is the chain
    const ir::Node& operand = x.op == ir::OpKind::Input ? x : y;
    if (operand.dtype != ir::DType::F32) return std::nullopt;
    const auto oe = operand.shape.extents();
    if (operand.shape == mm.shape) {
      if (e.residual) return std::nullopt;
      e.residual = operand.id;
    } else if (!oe.empty() && oe.back() == n && operand.shape.numel() == n) {
      if (e.bias) return std::nullopt;
      e.bias = operand.id;
    } else {
      return std::nullopt;
    }
    at = &body.node(operand.id == x.id ? y.id : x.id);
    ++chain;
  }
  if (chain == 0) return std::nullopt;  // the product is the output: nothing to fuse
  // Nothing else computed, and each computed node used once (no other reader of the product or a partial sum):
  // the matmul and the chain, beside Inputs, the operands' widening casts and B's transposing permute.
  std::size_t computed = 0;
  for (const auto& x : body.nodes()) {
    if (x.op == ir::OpKind::Input || x.op == ir::OpKind::Cast || x.op == ir::OpKind::Permute) continue;
    ++computed;
    std::size_t uses = 0;
    for (const auto& y : body.nodes())
      for (auto in : y.inputs) uses += in == x.id;
    if (uses > 1) return std::nullopt;
  }
  if (computed != chain + 1) return std::nullopt;
  return e;
}

}  // namespace

std::optional<GemmShape> gemm_shape(const compile::Kernel& kernel, std::string* why) {
  auto no = [&](const char* reason) -> std::optional<GemmShape> {
    *why = reason;
    return std::nullopt;
  };
  const ir::Node* mm = nullptr;
  for (const auto& n : kernel.body.nodes())
    if (n.op == ir::OpKind::MatMul) mm = &n;
  if (!mm) return no("no matmul in the kernel");
  // An operand is a kernel input, or a kernel input widened from bf16 or f16 to the f32 product.
  auto stored = [&](const ir::Node& x) -> const ir::Node& {
    if (x.op != ir::OpKind::Cast || x.dtype != ir::DType::F32) return x;
    const auto& src = kernel.body.node(x.inputs[0]);
    return src.op == ir::OpKind::Input && (src.dtype == ir::DType::BF16 || src.dtype == ir::DType::F16) ? src : x;
  };
  // B may be a permute swapping the last two dims of such an operand (BackendTraits::matmul_transposed_b): the
  // stored [..., N, K] matrix, read transposed.
  const ir::Node* bl = &kernel.body.node(mm->inputs[1]);  // B as the matmul sees it
  const bool trans_b = bl->op == ir::OpKind::Permute && ir::swaps_last_two(bl->attrs.get_ints("perm"));
  const auto& an = stored(kernel.body.node(mm->inputs[0]));
  const auto& bn = stored(trans_b ? kernel.body.node(bl->inputs[0]) : *bl);
  if (an.op != ir::OpKind::Input || bn.op != ir::OpKind::Input) return no("an operand is computed in the kernel");
  if (mm->dtype != ir::DType::F32 && mm->dtype != ir::DType::F64) return no("not f32 or f64");
  if (an.dtype != bn.dtype) return no("operands of two types");
  if (an.dtype != mm->dtype && mm->dtype != ir::DType::F32) return no("narrow operands of an f64 product");
  if (!mm->shape.is_static()) return no("a symbolic dim");
  const auto oe = mm->shape.extents(), ae = an.shape.extents(), be = bl->shape.extents();
  const std::size_t r = oe.size();
  if (r < 2 || ae.size() < 2 || be.size() < 2) return no("an operand of rank below 2");
  const std::int64_t m = oe[r - 2], n = oe[r - 1], k = ae.back();
  if (m <= 0 || n <= 0 || k <= 0) return no("a zero-size dim");
  const std::vector<std::int64_t> batch(oe.begin(), oe.end() - 2);
  std::int64_t count = 1;
  for (auto d : batch) count *= d;
  // An operand's batch dims are the output's (one matrix per batch) or all ones (one matrix for all).
  auto batched = [&](const std::vector<std::int64_t>& e) -> std::optional<bool> {
    const std::vector<std::int64_t> b(e.begin(), e.end() - 2);
    if (std::all_of(b.begin(), b.end(), [](std::int64_t d) { return d == 1; })) return false;
    if (b != batch) return std::nullopt;
    return true;
  };
  const auto a_batched = batched(ae), b_batched = batched(be);
  if (!a_batched || !b_batched) return no("batch dims broadcast partially");
  if (count > std::numeric_limits<std::int32_t>::max()) return no("more batches than cuBLASLt takes");
  GemmShape s;
  s.n = n;
  s.k = k;
  s.f64 = mm->dtype == ir::DType::F64;
  s.operands = an.dtype;
  s.result = mm->dtype;
  // The product's one use is the kernel's one output, a cast to the operands' narrow type: cuBLASLt writes it.
  if (s.operands != mm->dtype && kernel.body.outputs().size() == 1) {
    const auto& out = kernel.body.node(kernel.body.outputs()[0].node);
    std::size_t uses = 0;
    for (const auto& x : kernel.body.nodes())
      for (auto in : x.inputs) uses += in == mm->id;
    if (out.op == ir::OpKind::Cast && out.inputs[0] == mm->id && out.dtype == s.operands && uses == 1) {
      s.result = out.dtype;
      s.cast_output = true;
    }
  }
  s.matmul = mm->id;
  s.a = an.id;
  s.b = bn.id;
  s.trans_b = trans_b;
  if (*a_batched && !*b_batched) {  // one GEMM over every batch's rows
    s.rows = m * count;
    s.batches = 1;
  } else {
    s.rows = m;
    s.batches = count;
    s.stride_a = *a_batched ? m * k : 0;
    s.stride_b = *b_batched ? k * n : 0;
    s.stride_c = m * n;
  }
  if (!s.cast_output && !s.f64 && s.batches == 1 && env::get_bool("RLX_CUDA_GEMM_EPILOGUE"))
    s.epilogue = gemm_epilogue(kernel, *mm, n);
  return s;
}

void gemm_on_host(const GemmShape& s, const double* a, const double* b, double* c, const double* bias,
                  const double* residual) {
  for (std::int64_t bi = 0; bi < s.batches; ++bi) {
    // cuBLAS's operands, column-major: A' = our B (n x k, ld n; or, transposed, the stored k x n, ld k, read as
    // op T), B' = our A (k x rows, ld k), C' (n x rows, ld n).
    const double* ap = b + bi * s.stride_b;
    const double* bp = a + bi * s.stride_a;
    double* cp = c + bi * s.stride_c;
    for (std::int64_t j = 0; j < s.rows; ++j)
      for (std::int64_t i = 0; i < s.n; ++i) {
        double acc = 0;
        for (std::int64_t l = 0; l < s.k; ++l) acc += (s.trans_b ? ap[l + i * s.k] : ap[i + l * s.n]) * bp[l + j * s.k];
        if (residual) acc += residual[bi * s.stride_c + i + j * s.n];
        if (bias) acc += bias[i];
        if (s.epilogue && s.epilogue->relu) acc = std::max(acc, 0.0);
        cp[i + j * s.n] = acc;
      }
  }
}

}  // namespace rlx::backends::cuda
