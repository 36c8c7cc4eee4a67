// Kernel bodies onto mlx::core. Each op keeps its op-table contract
// (src/ops/*.cpp, checked against the reference by the conformance suite)
// where MLX's own op differs: integer division truncates and x / 0 = 0, max,
// min and their reductions propagate NaN, argmax takes the first NaN, casts
// to integers truncate with NaN and infinities as 0.
#ifdef RLX_HAVE_MLX
#include "backends/mlx/lower.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <set>

#include "rlx/backends/mlx/mlx_backend.hpp"
#include "rlx/backends/mlx/mlx_kernel.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/op_def.hpp"

namespace rlx::backends::mlx {

using ir::DType;
using ir::OpKind;

mx::Dtype storage_dtype(DType t) {
  switch (t) {
    case DType::F32: return mx::float32;
    case DType::F16: return mx::float16;
    case DType::BF16: return mx::bfloat16;
    case DType::F64: return mx::float64;
    case DType::I8: return mx::int8;
    case DType::U8: return mx::uint8;
    case DType::I32: return mx::int32;
    case DType::I64: return mx::int64;
    case DType::Bool: return mx::bool_;
    // Held for the host steps that compute with them (host_reason); MLX's own kernels never see them.
    case DType::I16: return mx::int16;
    case DType::U16: return mx::uint16;
    case DType::U32: return mx::uint32;
    case DType::U64: return mx::uint64;
    default: return mx::uint8;  // a block-quantized type's bytes, a storage-only type's byte an element
  }
}

mx::Shape storage_shape(DType t, const std::vector<std::int64_t>& shape) {
  if (ir::is_block_quantized(t)) return {mx::ShapeElem(ir::storage_bytes(t, shape))};
  mx::Shape s;
  for (auto d : shape) s.push_back(mx::ShapeElem(d));
  return s;
}

namespace {
template <class T>
mx::array copy_of(const void* data, mx::Shape shape, mx::Dtype t) {
  return mx::array(static_cast<const T*>(data), std::move(shape), t);
}
}  // namespace

mx::array from_bytes(const void* data, DType t, const std::vector<std::int64_t>& shape) {
  auto s = storage_shape(t, shape);
  // A zero-size value may come with no pointer; the copy reads nothing.
  static const std::byte none[8]{};
  if (!data) data = none;
  switch (t) {
    case DType::F32: return copy_of<float>(data, s, mx::float32);
    case DType::F16: return copy_of<mx::float16_t>(data, s, mx::float16);
    case DType::BF16: return copy_of<mx::bfloat16_t>(data, s, mx::bfloat16);
    case DType::F64: return copy_of<double>(data, s, mx::float64);
    case DType::I8: return copy_of<std::int8_t>(data, s, mx::int8);
    case DType::I32: return copy_of<std::int32_t>(data, s, mx::int32);
    case DType::I64: return copy_of<std::int64_t>(data, s, mx::int64);
    case DType::Bool: return copy_of<bool>(data, s, mx::bool_);
    case DType::I16: return copy_of<std::int16_t>(data, s, mx::int16);
    case DType::U16: return copy_of<std::uint16_t>(data, s, mx::uint16);
    case DType::U32: return copy_of<std::uint32_t>(data, s, mx::uint32);
    case DType::U64: return copy_of<std::uint64_t>(data, s, mx::uint64);
    default: return copy_of<std::uint8_t>(data, s, mx::uint8);  // u8, the block and storage-only types' bytes
  }
}

mx::StreamOrDevice device_for(const mx::array& a) {
  if (a.dtype() == mx::float64) return mx::Device(mx::Device::cpu);
  return {};
}

void to_bytes(mx::array a, void* dst, std::size_t nbytes) {
  if (nbytes != a.nbytes())
    throw Error(fmt::format("mlx: a value of {} bytes where {} were expected", a.nbytes(), nbytes));
  if (nbytes == 0) return;  // nothing to evaluate (MLX's GPU kernels divide by the size)
  mx::eval(a);
  if (!a.flags().row_contiguous) {  // broadcasts and transposes are strided views
    a = mx::contiguous(a, false, device_for(a));
    mx::eval(a);
  }
  std::memcpy(dst, a.data<std::uint8_t>(), nbytes);
}

namespace {

const std::set<OpKind>& lowered_ops() {
  static const std::set<OpKind> ops = [] {
    const auto t = mlx::traits();
    return std::set<OpKind>(t.native_ops.begin(), t.native_ops.end());
  }();
  return ops;
}

bool float_dtype(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64; }

}  // namespace

std::string host_reason(const compile::Kernel& k) {
  for (const auto& n : k.body.nodes()) {
    if (n.op == OpKind::Custom) {
      const auto& name = n.attrs.get_str("op");
      if (!find_mlx_kernel(name)) return fmt::format("custom op '{}' has no MLX kernel (register_mlx_kernel)", name);
    } else if (!lowered_ops().contains(n.op)) {
      return fmt::format("{} has no MLX lowering", ir::op_name(n.op));
    }
    std::vector<DType> types{n.dtype};
    for (auto in : n.inputs) types.push_back(k.body.node(in).dtype);
    for (DType t : types) {
      // MLX runs f64 on its CPU device only; RLX's f64 promises float64 results everywhere.
      if (t == DType::F64) return "f64 runs on the host";
      if (ir::is_block_quantized(t)) return "block-quantized values run on the host";
      if (!traits().native_dtypes.contains(t))
        return fmt::format("{} is not a dtype MLX computes here", ir::dtype_name(t));
    }
    if (n.op == OpKind::MatMul && !float_dtype(n.dtype)) return "MLX's matmul takes floats only";
  }
  return {};
}

namespace {

mx::array scalar_like(double v, const mx::array& like) { return mx::array(v, like.dtype()); }

int axis_of(const ir::Node& n, std::int64_t rank, const char* key = "axis") {
  auto a = n.attrs.get_int(key);
  return int(a < 0 ? a + rank : a);
}

std::vector<int> axes_of(const ir::Node& n, std::int64_t rank, const char* key = "axes") {
  std::vector<int> out;
  for (auto a : n.attrs.get_ints(key)) out.push_back(int(a < 0 ? a + rank : a));
  return out;
}

bool is_float(const mx::array& a) { return mx::issubdtype(a.dtype(), mx::floating); }

// NaN wherever `nan` is true, else `v`.
mx::array nan_where(const mx::array& nan, const mx::array& v) {
  return mx::where(nan, mx::array(std::numeric_limits<float>::quiet_NaN(), v.dtype()), v);
}

mx::array int_divide(const mx::array& a, const mx::array& b) {
  auto zero = mx::equal(b, scalar_like(0, b));
  auto safe = mx::where(zero, scalar_like(1, b), b);
  auto q = mx::floor_divide(a, safe);  // floor; truncation differs where the remainder is nonzero and signs differ
  auto r = mx::remainder(a, safe);
  auto neg = mx::not_equal(mx::less(a, scalar_like(0, a)), mx::less(safe, scalar_like(0, b)));
  q = mx::where(mx::logical_and(mx::not_equal(r, scalar_like(0, r)), neg), mx::add(q, scalar_like(1, q)), q);
  return mx::where(zero, scalar_like(0, q), q);
}

mx::array int_mod(const mx::array& a, const mx::array& b) {
  auto bad = mx::logical_or(mx::equal(b, scalar_like(0, b)), mx::equal(b, scalar_like(-1, b)));
  auto r = mx::remainder(a, mx::where(bad, scalar_like(1, b), b));
  return mx::where(bad, scalar_like(0, r), r);
}

// ipow's contract for a negative exponent: what 1 / base^|e| truncates to.
mx::array int_pow(const mx::array& a, const mx::array& e) {
  auto negative = mx::less(e, scalar_like(0, e));
  auto p = mx::power(a, mx::maximum(e, scalar_like(0, e)));
  auto one = scalar_like(1, a), zero = scalar_like(0, a);
  auto odd = mx::not_equal(mx::remainder(e, scalar_like(2, e)), scalar_like(0, e));
  auto minus_one = mx::where(odd, scalar_like(-1, a), one);
  auto inv = mx::where(mx::equal(a, one), one, mx::where(mx::equal(a, scalar_like(-1, a)), minus_one, zero));
  return mx::where(negative, inv, p);
}

mx::array extreme(const mx::array& a, const mx::array& b, bool is_max) {
  auto m = is_max ? mx::maximum(a, b) : mx::minimum(a, b);
  if (!is_float(a)) return m;
  return nan_where(mx::logical_or(mx::isnan(a), mx::isnan(b)), m);
}

mx::array cast(const mx::array& x, DType to) {
  const mx::Dtype t = storage_dtype(to);
  if (to == DType::Bool) return mx::not_equal(x, scalar_like(0, x));
  if (is_float(x) && !float_dtype(to)) {
    // Truncation with NaN and the infinities as 0; through i64, whose narrowing wraps like a two's complement store.
    auto finite = mx::where(mx::isfinite(x), x, scalar_like(0, x));
    auto wide = mx::astype(finite, mx::int64);
    return to == DType::I64 ? wide : mx::astype(wide, t);
  }
  return mx::astype(x, t);
}

mx::array reduce(const ir::Node& n, const mx::array& x) {
  const bool keep = n.attrs.get_bool("keepdims");
  if (n.op != OpKind::ArgMax && n.op != OpKind::ArgMin && x.size() == 0) {
    // Over nothing, the identity, as the reference: 0 for sum, 1 for prod, NaN (0/0) for mean, -inf / inf for
    // max / min (0 in integers). MLX's GPU reductions divide by the reduced size, and MLX refuses max and min.
    double identity = 0;
    switch (n.op) {
      case OpKind::ReduceProd: identity = 1; break;
      case OpKind::ReduceMean: identity = NAN; break;
      case OpKind::ReduceMax: identity = is_float(x) ? -INFINITY : 0; break;
      case OpKind::ReduceMin: identity = is_float(x) ? INFINITY : 0; break;
      default: break;
    }
    return mx::full(storage_shape(n.dtype, n.shape.extents()), mx::array(identity), x.dtype());
  }
  switch (n.op) {
    case OpKind::ReduceSum: return mx::sum(x, axes_of(n, x.ndim()), keep);
    case OpKind::ReduceMean: return mx::mean(x, axes_of(n, x.ndim()), keep);
    case OpKind::ReduceProd: return mx::prod(x, axes_of(n, x.ndim()), keep);
    case OpKind::ReduceMax:
    case OpKind::ReduceMin: {
      const auto axes = axes_of(n, x.ndim());
      auto m = n.op == OpKind::ReduceMax ? mx::max(x, axes, keep) : mx::min(x, axes, keep);
      return is_float(x) ? nan_where(mx::any(mx::isnan(x), axes, keep), m) : m;
    }
    default: break;
  }
  // ArgMax / ArgMin: the first extreme; the first NaN when there is one (NaN counts as the extreme, as in NumPy).
  const int axis = axis_of(n, x.ndim());
  auto idx = n.op == OpKind::ArgMax ? mx::argmax(x, axis, keep) : mx::argmin(x, axis, keep);
  if (is_float(x)) {
    auto nan = mx::isnan(x);
    idx = mx::where(mx::any(nan, axis, keep), mx::argmax(nan, axis, keep), idx);
  }
  return idx;
}

// Python's clamping of one slice bound on an axis of `size`.
int clamp_bound(std::int64_t i, std::int64_t size) {
  return int(std::clamp(i < 0 ? i + size : i, std::int64_t(0), size));
}

mx::array slice(const ir::Node& n, const mx::array& x) {
  const auto &starts = n.attrs.get_ints("starts"), &ends = n.attrs.get_ints("ends"), &steps = n.attrs.get_ints("steps");
  mx::Shape b, e, s;
  for (std::size_t d = 0; d < starts.size(); ++d) {
    const std::int64_t size = x.shape(int(d));
    const int lo = clamp_bound(starts[d], size);
    b.push_back(lo);
    e.push_back(std::max(lo, clamp_bound(ends[d], size)));
    s.push_back(mx::ShapeElem(steps[d]));
  }
  return mx::slice(x, b, e, s);
}

// pads = [before..., after...]; a negative pad crops.
mx::array pad(const ir::Node& n, mx::array x) {
  const auto& pads = n.attrs.get_ints("pads");
  const std::size_t rank = x.ndim();
  mx::Shape b(rank, 0), e, s(rank, 1), lo(rank, 0), hi(rank, 0);
  bool crop = false;
  std::vector<int> axes;
  for (std::size_t d = 0; d < rank; ++d) {
    const auto before = pads[d], after = pads[rank + d];
    const auto size = x.shape(int(d));
    b[d] = mx::ShapeElem(std::max<std::int64_t>(0, -before));
    e.push_back(mx::ShapeElem(size - std::max<std::int64_t>(0, -after)));
    crop |= before < 0 || after < 0;
    lo[d] = mx::ShapeElem(std::max<std::int64_t>(0, before));
    hi[d] = mx::ShapeElem(std::max<std::int64_t>(0, after));
    axes.push_back(int(d));
  }
  if (crop) x = mx::slice(x, b, e, s);
  if (rank == 0) return x;
  return mx::pad(x, axes, lo, hi, scalar_like(n.attrs.get_float("value"), x));
}

mx::array iota(const ir::Node& n, mx::Dtype t) {
  const auto shape = storage_shape(n.dtype, n.shape.extents());
  const int axis = axis_of(n, std::int64_t(shape.size()));
  mx::Shape along(shape.size(), 1);
  along[std::size_t(axis)] = shape[std::size_t(axis)];
  auto r = mx::arange(0.0, double(shape[std::size_t(axis)]), 1.0, t);
  return mx::broadcast_to(mx::reshape(r, along), shape);
}

// torch.gather and scatter_add address only idx's extent of x on the other axes (MLX's along-axis ops broadcast
// instead): the block of x they touch.
mx::Shape block_of(const mx::array& x, const mx::array& idx, int axis) {
  mx::Shape stop = idx.shape();
  stop[std::size_t(axis)] = x.shape(axis);
  return stop;
}

mx::array gather(const ir::Node& n, const mx::array& x, const mx::array& idx) {
  const int axis = axis_of(n, x.ndim());
  const mx::Shape stop = block_of(x, idx, axis);
  if (stop == x.shape()) return mx::take_along_axis(x, idx, axis);
  return mx::take_along_axis(mx::slice(x, mx::Shape(stop.size(), 0), stop), idx, axis);
}

mx::array scatter_add(const ir::Node& n, const mx::array& x, const mx::array& idx, mx::array src) {
  const int axis = axis_of(n, x.ndim());
  const mx::Shape zeros(idx.ndim(), 0), ones(idx.ndim(), 1);
  if (src.shape() != idx.shape()) src = mx::slice(src, zeros, idx.shape(), ones);  // torch reads idx's extent of src
  const mx::Shape stop = block_of(x, idx, axis);
  if (stop == x.shape()) return mx::scatter_add_axis(x, idx, src, axis);
  auto block = mx::scatter_add_axis(mx::slice(x, zeros, stop), idx, src, axis);
  return mx::slice_update(x, block, zeros, stop, ones);
}

// layer_norm over dims [axis..): mx::fast::layer_norm normalizes the last dim, so the normalized dims are
// flattened into one (and gamma and beta with them); a scalar is a row of one, as in the reference.
mx::array layer_norm(const ir::Node& n, std::span<const mx::array> x) {
  const mx::Shape shape = x[0].shape();
  const auto rank = std::int64_t(shape.size());
  const int axis = rank ? axis_of(n, rank) : 0;
  mx::Shape rows(shape.begin(), shape.begin() + axis);
  rows.push_back(std::accumulate(shape.begin() + axis, shape.end(), mx::ShapeElem(1), std::multiplies<>()));
  auto flat = [](const mx::array& a) { return mx::reshape(a, {-1}); };
  std::optional<mx::array> gamma, beta;
  if (x.size() > 1) gamma = flat(x[1]);
  if (x.size() > 2) beta = flat(x[2]);
  auto y = mx::fast::layer_norm(mx::reshape(x[0], rows), gamma, beta, float(n.attrs.get_float("eps")));
  return mx::reshape(y, shape);
}

// attention through mx::fast::scaled_dot_product_attention, with the op table's masks: a bool mask becomes an
// additive one of 0 and -inf (MLX's own bool masking writes the dtype's lowest value, so a fully masked row would
// average v where RLX's softmax gives 0/0 = NaN), and causal keeps key j for query i when j <= i (top-left, as
// torch's is_causal; MLX's "causal" is aligned bottom-right, so it is used only when the two lengths agree).
mx::array attention(const ir::Node& n, std::span<const mx::array> x) {
  const mx::array &q = x[0], &k = x[1], &v = x[2];
  double scale = n.attrs.get_float("scale");
  if (scale == 0.0) scale = 1.0 / std::sqrt(double(q.shape(-1)));
  const bool causal = n.attrs.get_bool("causal");
  const int lq = q.shape(-2), lk = k.shape(-2);
  const mx::array zero(0.0f, q.dtype()), neg_inf(-INFINITY, q.dtype());
  std::optional<mx::array> mask;
  if (x.size() > 3) mask = x[3].dtype() == mx::bool_ ? mx::where(x[3], zero, neg_inf) : x[3];
  if (causal && !mask && lq == lk) return mx::fast::scaled_dot_product_attention(q, k, v, float(scale), "causal");
  if (causal) {
    auto rows = mx::reshape(mx::arange(lq, mx::int32), {lq, 1});
    auto cols = mx::reshape(mx::arange(lk, mx::int32), {1, lk});
    auto keep = mx::less_equal(cols, rows);
    mask = mask ? mx::where(keep, *mask, neg_inf) : mx::where(keep, zero, neg_inf);
  }
  if (!mask) return mx::fast::scaled_dot_product_attention(q, k, v, float(scale));
  return mx::fast::scaled_dot_product_attention(q, k, v, float(scale), "array", mask);
}

// conv1d and conv2d through mx::conv_general, which convolves channels-last: x goes N C (H) W -> N (H) W C and w
// O C/g (kh) kw -> O (kh) kw C/g, and the result comes back; padding is symmetric, as the op table's. An attribute
// of one value holds for every spatial dim, and a missing one takes the op table's default.
mx::array conv(const ir::Node& n, std::span<const mx::array> x) {
  const int spatial = x[0].ndim() - 2;
  auto ints = [&](std::string_view key, int dflt) {
    std::vector<int> v(std::size_t(spatial), dflt);
    const auto it = n.attrs.items().find(key);
    if (it == n.attrs.items().end()) return v;
    if (const auto* i = std::get_if<std::int64_t>(&it->second)) return std::vector<int>(std::size_t(spatial), int(*i));
    const auto& a = n.attrs.get_ints(key);
    if (a.size() == 1) return std::vector<int>(std::size_t(spatial), int(a[0]));
    if (!a.empty()) v.assign(a.begin(), a.end());
    return v;
  };
  std::vector<int> last(std::size_t(spatial) + 2), first(std::size_t(spatial) + 2);
  last[0] = first[0] = 0;
  for (int d = 0; d < spatial; ++d) last[std::size_t(d) + 1] = d + 2;
  last.back() = 1;
  first[1] = spatial + 1;
  for (int d = 0; d < spatial; ++d) first[std::size_t(d) + 2] = d + 1;
  const std::vector<int> padding = ints("padding", 0);
  auto y = mx::conv_general(mx::transpose(x[0], last), mx::transpose(x[1], last), ints("stride", 1), padding, padding,
                            ints("dilation", 1), std::vector<int>(std::size_t(spatial), 1),
                            int(n.attrs.int_or("groups", 1)));
  y = mx::transpose(y, first);
  if (x.size() > 2) {  // the bias, one per output channel
    mx::Shape b(std::size_t(spatial) + 2, 1);
    b[1] = x[2].shape(0);
    y = mx::add(y, mx::reshape(x[2], b));
  }
  return y;
}

// A custom op through its register_mlx_kernel function. MLX reports misuse with standard exceptions; they
// become rlx::Errors naming the node.
mx::array custom(const ir::Graph& body, const ir::Node& n, std::span<const mx::array> x) {
  const auto& name = n.attrs.get_str("op");
  const MlxKernel kernel = find_mlx_kernel(name);
  if (!kernel)
    throw Error(fmt::format("mlx: {}: custom op '{}' has no MLX kernel (register_mlx_kernel)",
                            ir::describe_node(body, n), name));
  try {
    return kernel(std::vector<mx::array>(x.begin(), x.end()), n.attrs);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(fmt::format("mlx: {}: the MLX kernel of custom op '{}' failed: {}", ir::describe_node(body, n), name,
                            e.what()));
  }
}

}  // namespace

mx::array lower_node(const ir::Graph& body, const ir::Node& n, std::span<const mx::array> x) {
  const mx::Dtype t = storage_dtype(n.dtype);
  const auto shape = storage_shape(n.dtype, n.shape.extents());
  // A value with no elements is all shape: no MLX op makes it, since MLX's GPU kernels divide by sizes (SIGFPE
  // on x86). The inputs of a non-empty result can be empty too: matmul over K = 0, pieces of a concat, a pad.
  const auto empty = [](const mx::array& a) { return a.size() == 0; };
  if (n.shape.numel() == 0) return from_bytes(nullptr, n.dtype, n.shape.extents());  // evaluated: no kernel
  if (n.op == OpKind::MatMul && (empty(x[0]) || empty(x[1]))) return mx::zeros(shape, t);
  if (n.op == OpKind::Pad && empty(x[0])) return mx::full(shape, mx::array(n.attrs.get_float("value")), t);
  if (n.op == OpKind::Concat && std::any_of(x.begin(), x.end(), empty)) {
    std::vector<mx::array> pieces;
    std::copy_if(x.begin(), x.end(), std::back_inserter(pieces), [&](const mx::array& a) { return !empty(a); });
    return mx::concatenate(pieces, axis_of(n, x[0].ndim()));
  }
  auto result = [&]() -> mx::array {
    switch (n.op) {
      case OpKind::Constant: return from_bytes(n.value->data(), n.dtype, n.value->shape());
      case OpKind::Iota: return iota(n, t);
      case OpKind::Neg: return mx::negative(x[0]);
      case OpKind::Abs: return mx::abs(x[0]);
      case OpKind::Exp: return mx::exp(x[0]);
      case OpKind::Log: return mx::log(x[0]);
      case OpKind::Sqrt: return mx::sqrt(x[0]);
      case OpKind::Rsqrt: return mx::rsqrt(x[0]);
      case OpKind::Reciprocal: return mx::reciprocal(x[0]);
      case OpKind::Tanh: return mx::tanh(x[0]);
      case OpKind::Relu: return mx::where(mx::less(x[0], scalar_like(0, x[0])), scalar_like(0, x[0]), x[0]);
      case OpKind::Erf: return mx::erf(x[0]);
      case OpKind::Sin: return mx::sin(x[0]);
      case OpKind::Cos: return mx::cos(x[0]);
      case OpKind::Floor: return is_float(x[0]) ? mx::floor(x[0]) : x[0];
      case OpKind::Ceil: return is_float(x[0]) ? mx::ceil(x[0]) : x[0];
      case OpKind::Round: return is_float(x[0]) ? mx::round(x[0]) : x[0];
      case OpKind::Sign: {
        auto s = mx::sign(x[0]);
        return is_float(x[0]) ? mx::where(mx::isnan(x[0]), x[0], s) : s;
      }
      case OpKind::Not: return mx::logical_not(x[0]);
      case OpKind::Add: return mx::add(x[0], x[1]);
      case OpKind::Sub: return mx::subtract(x[0], x[1]);
      case OpKind::Mul: return mx::multiply(x[0], x[1]);
      case OpKind::Div: return is_float(x[0]) ? mx::divide(x[0], x[1]) : int_divide(x[0], x[1]);
      case OpKind::Pow: return is_float(x[0]) ? mx::power(x[0], x[1]) : int_pow(x[0], x[1]);
      case OpKind::Max: return extreme(x[0], x[1], true);
      case OpKind::Min: return extreme(x[0], x[1], false);
      case OpKind::Mod: return is_float(x[0]) ? mx::remainder(x[0], x[1]) : int_mod(x[0], x[1]);
      case OpKind::Eq: return mx::equal(x[0], x[1]);
      case OpKind::Ne: return mx::not_equal(x[0], x[1]);
      case OpKind::Lt: return mx::less(x[0], x[1]);
      case OpKind::Le: return mx::less_equal(x[0], x[1]);
      case OpKind::Gt: return mx::greater(x[0], x[1]);
      case OpKind::Ge: return mx::greater_equal(x[0], x[1]);
      case OpKind::And: return mx::logical_and(x[0], x[1]);
      case OpKind::Or: return mx::logical_or(x[0], x[1]);
      case OpKind::Where: return mx::where(x[0], x[1], x[2]);
      case OpKind::Cast: return cast(x[0], n.attrs.get_dtype("to"));
      case OpKind::Clamp: {
        const double lo = n.attrs.get_float("min"), hi = n.attrs.get_float("max");
        if (std::isnan(lo) || std::isnan(hi)) return mx::full(x[0].shape(), mx::array(NAN), t);
        // On integers, the bounds truncated: trunc is monotone and keeps integers, so it commutes with the clip.
        const bool f = is_float(x[0]);
        auto c = mx::minimum(mx::maximum(x[0], scalar_like(f ? lo : std::trunc(lo), x[0])),
                             scalar_like(f ? hi : std::trunc(hi), x[0]));
        return f ? mx::where(mx::isnan(x[0]), x[0], c) : c;
      }
      case OpKind::ReduceSum:
      case OpKind::ReduceMean:
      case OpKind::ReduceMax:
      case OpKind::ReduceMin:
      case OpKind::ReduceProd:
      case OpKind::ArgMax:
      case OpKind::ArgMin: return reduce(n, x[0]);
      case OpKind::MatMul: return mx::matmul(x[0], x[1]);
      case OpKind::Reshape:
      case OpKind::Squeeze:
      case OpKind::Unsqueeze: return mx::reshape(x[0], shape);
      case OpKind::Permute: return mx::transpose(x[0], axes_of(n, x[0].ndim(), "perm"));
      case OpKind::Expand: return mx::broadcast_to(x[0], shape);
      case OpKind::Slice: return slice(n, x[0]);
      case OpKind::Concat: return mx::concatenate(std::vector<mx::array>(x.begin(), x.end()), axis_of(n, x[0].ndim()));
      case OpKind::Pad: return pad(n, x[0]);
      case OpKind::Gather: return gather(n, x[0], x[1]);
      case OpKind::IndexSelect: return mx::take(x[0], x[1], axis_of(n, x[0].ndim()));
      case OpKind::ScatterAdd: return scatter_add(n, x[0], x[1], x[2]);
      case OpKind::Softmax: return mx::softmax(x[0], axis_of(n, x[0].ndim()), /*precise=*/true);
      case OpKind::LayerNorm: return layer_norm(n, x);
      case OpKind::RmsNorm:
        return mx::fast::rms_norm(x[0], x.size() > 1 ? std::optional(x[1]) : std::nullopt,
                                  float(n.attrs.get_float("eps")));
      case OpKind::Attention: return attention(n, x);
      case OpKind::Conv1d:
      case OpKind::Conv2d: return conv(n, x);
      case OpKind::Custom: return custom(body, n, x);
      case OpKind::Flip: {
        mx::array r = x[0];
        for (int a : axes_of(n, x[0].ndim())) r = mx::flip(r, a);
        return r;
      }
      default: break;
    }
    throw Error(fmt::format("mlx: {}: no MLX lowering (a backend bug: host_reason should have sent it to the host)",
                            ir::describe_node(body, n)));
  }();
  if (result.dtype() != t) result = mx::astype(result, t);
  if (result.shape() != shape)
    throw Error(fmt::format("mlx: {}{}: the MLX lowering gives shape [{}], the node declares {}",
                            ir::describe_node(body, n),
                            n.op == OpKind::Custom ? fmt::format(" (custom op '{}')", n.attrs.get_str("op")) : "",
                            fmt::join(result.shape(), ","), n.shape.str()));
  return result;
}

}  // namespace rlx::backends::mlx
#endif  // RLX_HAVE_MLX
