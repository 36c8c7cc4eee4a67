// ONNX's neural-network ops: MatMul and Gemm, Softmax, the normalizations, Conv and the pools, Dropout
// (inference), and the quantization ops, decomposed onto RLX's float ops until the Q/DQ kernels land.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "onnx/detail.hpp"
#include "onnx/proto/onnx.pb.h"
#include "rlx/ir/limits.hpp"

namespace rlx::onnx::detail {

namespace {

using ir::OpKind;

// numpy.matmul, 1-D operands included.
NodeId matmul(Ctx& c, NodeId a, NodeId b) {
  const auto ra = c.g.node(a).shape.rank(), rb = c.g.node(b).shape.rank();
  if (ra == 0 || rb == 0) c.fail("MatMul operands must have rank >= 1");
  if (ra == 1) a = c.g.unsqueeze(a, {0});
  if (rb == 1) b = c.g.unsqueeze(b, {1});
  auto y = c.g.matmul(a, b);
  const auto ry = c.g.node(y).shape.rank();
  if (rb == 1) y = c.g.squeeze(y, {std::int64_t(ry) - 1});
  if (ra == 1) y = c.g.squeeze(y, {std::int64_t(c.g.node(y).shape.rank()) - (rb == 1 ? 1 : 2)});
  return y;
}

// Softmax-like ops: from opset 13 over one axis; before, over the input flattened to 2-D at axis.
template <class F>
NodeId over_axis(Ctx& c, F f) {
  auto x = c.in(0);
  const auto r = c.rank(0);
  if (c.opset() >= 13) return f(x, axis_of(c, c.attr_int("axis", -1), r));
  const auto axis = axis_of(c, c.attr_int("axis", 1), r);
  auto sh = c.shape(0);
  std::int64_t outer = 1, inner = 1;
  for (std::size_t i = 0; i < r; ++i) (std::int64_t(i) < axis ? outer : inner) *= sh[i];
  auto y = f(c.g.reshape(x, I64s{outer, inner}), 1);
  return c.g.reshape(y, sh);
}

NodeId hardmax(Ctx& c, NodeId x, std::int64_t axis) {
  auto idx = c.g.argmax(x, axis, true);
  auto pos = c.g.iota(c.g.node(x).shape, axis, ir::DType::I64);
  return c.g.cast(c.g.binary(OpKind::Eq, pos, idx), c.g.node(x).dtype);
}

// Reshapes a per-channel [C] vector to broadcast against [N, C, spatial...].
NodeId per_channel(Ctx& c, NodeId v, std::size_t rank) {
  if (c.g.node(v).shape.rank() != 1 || rank < 2)
    c.fail("a per-channel operand must be 1-D, against an [N, C, ...] input");
  I64s sh(rank - 1, 1);
  sh[0] = ext(c, v)[0];
  return c.g.reshape(v, sh);
}

struct Window {
  I64s kernel, strides, dilations, pads;  // pads: begins then ends, per spatial dim
};

// The window attributes of Conv and the pools, with auto_pad resolved against the input's extents.
Window window(Ctx& c, const I64s& in, const I64s& kernel) {
  const std::size_t s = kernel.size();
  Window w{kernel, c.attr_ints("strides", I64s(s, 1)), c.attr_ints("dilations", I64s(s, 1)),
           c.attr_ints("pads", I64s(2 * s, 0))};
  if (w.strides.size() != s || w.dilations.size() != s || w.pads.size() != 2 * s)
    c.fail("strides, dilations and pads do not match the kernel's rank");
  const auto auto_pad = c.attr_str("auto_pad", "NOTSET");
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    for (std::size_t i = 0; i < s; ++i) {
      const std::int64_t out = (in[i] + w.strides[i] - 1) / w.strides[i];
      const std::int64_t total =
          std::max<std::int64_t>(0, (out - 1) * w.strides[i] + (kernel[i] - 1) * w.dilations[i] + 1 - in[i]);
      const std::int64_t small = total / 2, big = total - small;
      w.pads[i] = auto_pad == "SAME_UPPER" ? small : big;
      w.pads[s + i] = auto_pad == "SAME_UPPER" ? big : small;
    }
  } else if (auto_pad == "VALID") {
    std::fill(w.pads.begin(), w.pads.end(), 0);
  } else if (auto_pad != "NOTSET") {
    c.fail(fmt::format("auto_pad '{}' is not supported", auto_pad));
  }
  for (auto v : w.strides)
    if (v <= 0) c.fail("a stride is not positive");
  for (auto v : w.dilations)
    if (v <= 0) c.fail("a dilation is not positive");
  for (auto v : w.pads)
    if (v < 0) c.fail("a pad is negative");
  return w;
}

// Pools as a max or sum over the kernel's offsets of strided slices of the padded input (any number of
// spatial dims, dilation, ceil_mode). Average divides by the window's size, or by the count of input
// elements under it when count_include_pad is 0.
enum class Pool : std::uint8_t { Max, Average, Lp };

// `argmax`, for MaxPool's Indices output: each maximum's flat index in the input (the first of equal
// maxima, row-major over the spatial dims, or column-major with storage_order 1; padding not counted).
NodeId pool(Ctx& c, Pool kind, std::optional<NodeId>* argmax = nullptr) {
  const bool is_max = kind == Pool::Max;
  auto x = c.in(0);
  const auto p_norm = double(c.attr_int("p", 2));
  if (kind == Pool::Lp) x = c.g.binary(OpKind::Pow, c.g.unary(OpKind::Abs, x), k(c, p_norm, x));
  const auto sh = c.shape(0);
  if (sh.size() < 3) c.fail("the input must be [N, C, spatial...]");
  const std::size_t s = sh.size() - 2;
  const I64s in(sh.begin() + 2, sh.end());
  const auto kernel = c.attr_ints("kernel_shape");
  if (kernel.size() != s) c.fail("kernel_shape does not match the input's spatial rank");
  auto w = window(c, in, kernel);
  std::int64_t taps = 1;
  for (auto kd : kernel) {
    if (kd <= 0) c.fail("kernel_shape must be positive");
    taps = ir::limits::checked_mul(taps, kd, "the pool's window");
  }
  if (taps > 4096) c.fail("windows of more than 4096 elements are not supported");
  const bool ceil_mode = c.attr_int("ceil_mode", 0) != 0;
  I64s out(s), extra(s, 0);
  for (std::size_t i = 0; i < s; ++i) {
    const std::int64_t span = (kernel[i] - 1) * w.dilations[i] + 1;
    const std::int64_t room = in[i] + w.pads[i] + w.pads[s + i] - span;
    if (room < 0) c.fail("the window does not fit the padded input");
    out[i] = (ceil_mode ? (room + w.strides[i] - 1) / w.strides[i] : room / w.strides[i]) + 1;
    // ceil_mode: a last window must start inside the input or its left padding.
    if (ceil_mode && (out[i] - 1) * w.strides[i] >= in[i] + w.pads[i]) --out[i];
    extra[i] = std::max<std::int64_t>(0, (out[i] - 1) * w.strides[i] + span - (in[i] + w.pads[i] + w.pads[s + i]));
  }
  const double inf = std::numeric_limits<double>::infinity();
  I64s pads(2 * sh.size(), 0);
  for (std::size_t i = 0; i < s; ++i) {
    pads[2 + i] = w.pads[i];
    pads[sh.size() + 2 + i] = w.pads[s + i] + extra[i];
  }
  const bool any_pad = std::any_of(pads.begin(), pads.end(), [](auto v) { return v != 0; });
  auto padded = any_pad ? c.g.pad(x, pads, is_max ? -inf : 0.0) : x;
  const bool count_pad = c.attr_int("count_include_pad", 0) != 0;
  // The count of real (count_pad: real or explicit-pad) elements under each window, for the average.
  std::optional<NodeId> ones;
  if (kind == Pool::Average) {
    I64s one_sh{1, 1};
    one_sh.insert(one_sh.end(), in.begin(), in.end());
    ir::Tensor one(c.dtype(0), one_sh);
    for (std::int64_t i = 0; i < one.numel(); ++i) one.set(i, 1);
    I64s explicit_pads(2 * sh.size(), 0), tail(2 * sh.size(), 0);
    for (std::size_t i = 0; i < s; ++i) {
      explicit_pads[2 + i] = w.pads[i];
      explicit_pads[sh.size() + 2 + i] = w.pads[s + i];
      tail[sh.size() + 2 + i] = extra[i];
    }
    // The ceil_mode tail never counts; the explicit pads count when count_include_pad is 1.
    auto o = c.g.pad(c.constant(one), explicit_pads, count_pad ? 1.0 : 0.0);
    if (std::any_of(extra.begin(), extra.end(), [](auto v) { return v != 0; })) o = c.g.pad(o, tail, 0.0);
    ones = o;
  }
  std::optional<NodeId> pos, best;  // the flat spatial index of each padded position (-1 in the padding)
  if (argmax) {
    I64s pos_sh{1, 1};
    pos_sh.insert(pos_sh.end(), in.begin(), in.end());
    ir::Tensor t(ir::DType::I64, pos_sh);
    const bool column_major = c.attr_int("storage_order", 0) != 0;
    for (std::int64_t e = 0; e < t.numel(); ++e) {
      std::int64_t rest = e, flat = 0, stride = 1;
      I64s at(s);
      for (std::size_t i = s; i-- > 0;) at[i] = rest % in[i], rest /= in[i];
      for (std::size_t j = 0; j < s; ++j) {
        const std::size_t i = column_major ? j : s - 1 - j;
        flat += at[i] * stride;
        stride *= in[i];
      }
      t.set(e, double(flat));
    }
    pos = any_pad ? c.g.pad(c.constant(t), pads, -1) : c.constant(t);
  }
  std::optional<NodeId> acc, cnt;
  I64s offs(s, 0);
  I64s axes(s);
  std::iota(axes.begin(), axes.end(), 2);
  while (true) {
    I64s st(s), en(s);
    for (std::size_t i = 0; i < s; ++i) {
      st[i] = offs[i] * w.dilations[i];
      en[i] = st[i] + (out[i] - 1) * w.strides[i] + 1;
    }
    auto part = c.g.slice(padded, axes, st, en, w.strides);
    if (pos) {
      auto p = c.g.slice(*pos, axes, st, en, w.strides);
      best = !best ? c.g.expand(p, ir::Shape(ext(c, part))) : c.g.where(c.g.binary(OpKind::Gt, part, *acc), p, *best);
    }
    acc = !acc ? part : is_max ? c.g.binary(OpKind::Max, *acc, part) : c.g.add(*acc, part);
    if (ones) {
      auto cp = c.g.slice(*ones, axes, st, en, w.strides);
      cnt = !cnt ? cp : c.g.add(*cnt, cp);
    }
    std::size_t i = s;
    while (i-- > 0) {
      if (++offs[i] < kernel[i]) break;
      offs[i] = 0;
    }
    if (i == std::size_t(-1)) break;
  }
  if (argmax) {  // plus (n * C + c) * the spatial size
    std::int64_t spatial = 1;
    for (auto e : in) spatial *= e;
    I64s base_sh(sh.size(), 1);
    base_sh[0] = sh[0], base_sh[1] = sh[1];
    ir::Tensor base(ir::DType::I64, base_sh);
    for (std::int64_t e = 0; e < base.numel(); ++e) base.set(e, double(e * spatial));
    *argmax = c.g.add(*best, c.constant(base));
  }
  if (is_max) return *acc;
  if (kind == Pool::Lp) return c.g.binary(OpKind::Pow, *acc, k(c, 1.0 / p_norm, *acc));
  return c.g.div(*acc, *cnt);
}

// A 3-D convolution as 2-D ones, one per kernel depth kd: the input's depth slices kd*dil, kd*dil + stride, ...
// become images of a batch N*OD, convolved with the weight's slice at kd and summed. x's depth is padded
// already; `pads` are the symmetric pads of height and width.
NodeId conv3d(Ctx& c, NodeId x, NodeId wt, std::optional<NodeId> bias, const I64s& strides, const I64s& pads,
              const I64s& dil, std::int64_t groups) {
  const auto sh = ext(c, x), wsh = ext(c, wt);
  const std::int64_t n = sh[0], ch = sh[1], depth = sh[2], kd = wsh[2], o = wsh[0];
  const std::int64_t od = (depth - dil[0] * (kd - 1) - 1) / strides[0] + 1;
  if (od <= 0) c.fail(fmt::format("the kernel's depth {} (dilation {}) exceeds the input's {}", kd, dil[0], depth));
  std::optional<NodeId> acc;
  for (std::int64_t k = 0; k < kd; ++k) {
    auto slab = c.g.slice(x, {2}, {k * dil[0]}, {k * dil[0] + (od - 1) * strides[0] + 1}, {strides[0]});
    auto images = c.g.reshape(c.g.permute(slab, {0, 2, 1, 3, 4}), I64s{n * od, ch, sh[3], sh[4]});
    auto wk = c.g.reshape(c.g.slice(wt, {2}, {k}, {k + 1}), I64s{o, wsh[1], wsh[3], wsh[4]});
    auto y = c.g.conv2d(images, wk, std::nullopt, {strides[1], strides[2]}, pads, {dil[1], dil[2]}, groups);
    acc = acc ? c.g.add(*acc, y) : y;
  }
  const auto ys = ext(c, *acc);
  auto y = c.g.permute(c.g.reshape(*acc, I64s{n, od, o, ys[2], ys[3]}), {0, 2, 1, 3, 4});
  if (bias) y = c.g.add(y, c.g.reshape(*bias, I64s{o, 1, 1, 1}));
  return y;
}

NodeId conv(Ctx& c, NodeId x, NodeId wt, std::optional<NodeId> bias) {
  const auto sh = ext(c, x), wsh = ext(c, wt);
  if (sh.size() < 3 || sh.size() > 5) c.fail("only 1-D, 2-D and 3-D convolutions are supported");
  if (wsh.size() != sh.size()) c.fail("the weight's rank differs from the input's");
  const std::size_t s = sh.size() - 2;
  const I64s kernel(wsh.begin() + 2, wsh.end());
  auto w = window(c, I64s(sh.begin() + 2, sh.end()), kernel);
  const auto groups = c.attr_int("group", 1);
  // RLX's conv pads symmetrically; a lopsided pad is an explicit pad first.
  I64s sym(s);
  bool lopsided = false;
  for (std::size_t i = 0; i < s; ++i) {
    sym[i] = std::min(w.pads[i], w.pads[s + i]);
    lopsided = lopsided || w.pads[i] != w.pads[s + i];
  }
  if (lopsided) {
    I64s p(2 * sh.size(), 0);
    for (std::size_t i = 0; i < s; ++i) {
      p[2 + i] = w.pads[i] - sym[i];
      p[sh.size() + 2 + i] = w.pads[s + i] - sym[i];
    }
    x = c.g.pad(x, p, 0);
  }
  if (s == 1) return c.g.conv1d(x, wt, bias, w.strides[0], sym[0], w.dilations[0], groups);
  if (s == 3) {  // the depth's padding explicit, the rest conv2d's
    if (sym[0] > 0) {
      I64s p(2 * sh.size(), 0);
      p[2] = p[sh.size() + 2] = sym[0];
      x = c.g.pad(x, p, 0);
    }
    return conv3d(c, x, wt, bias, w.strides, {sym[1], sym[2]}, w.dilations, groups);
  }
  return c.g.conv2d(x, wt, bias, w.strides, sym, w.dilations, groups);
}

// The integer range of a quantized integer type.
std::pair<double, double> qrange(Ctx& c, ir::DType t) {
  const bool small = t == ir::DType::I4 || t == ir::DType::U4 || t == ir::DType::I2 || t == ir::DType::U2;
  if (small || t == ir::DType::U8 || t == ir::DType::I8 || t == ir::DType::I16 || t == ir::DType::U16)
    return ir::integer_range(t);
  c.fail(
      fmt::format("quantized type {} is not supported (uint8, int8, uint16, int16, uint4, int4, uint2, int2, "
                  "float8, float4e2m1)",
                  ir::dtype_name(t)));
}

// A per-tensor scalar or a per-axis [C] vector reshaped to broadcast along `axis` of `x`. With
// `block` > 0 (blocked quantization, opset 21) `v` has x's rank and ceil(D / block) entries along the
// axis: each is repeated over its block, and the last block may be short.
NodeId along(Ctx& c, NodeId v, std::int64_t axis, NodeId x, std::int64_t block = 0) {
  const auto& vs = c.g.node(v).shape;
  const auto xs = ext(c, x);
  const auto r = xs.size();
  if (vs.rank() == 0 && block <= 0) return v;
  // A [1] scale or zero point is per tensor, as ONNX's reference broadcasts it (the axis is not read).
  if (vs.rank() == 1 && vs[0].is_static() && vs[0].size == 1 && block <= 0) return c.g.reshape(v, ir::Shape{});
  const auto a = std::size_t(axis_of(c, axis, r));
  if (block <= 0) {
    if (vs.rank() != 1) c.fail("a scale or zero point of rank 2 or more needs block_size (blocked quantization)");
    if (vs[0].size != xs[a])
      c.fail(fmt::format("the per-axis scale or zero point has {} entries, axis {} of the input {}", vs[0].size, a,
                         xs[a]));
    I64s sh(r, 1);
    sh[a] = vs[0].size;
    return c.g.reshape(v, sh);
  }
  auto vx = ext(c, v);
  bool fits = vx.size() == r && vx[a] == (xs[a] + block - 1) / block;
  for (std::size_t i = 0; fits && i < r; ++i) fits = i == a || vx[i] == xs[i];
  if (!fits)
    c.fail(
        fmt::format("blocked quantization: the scale or zero point is [{}]; with block_size {} on axis {} of "
                    "[{}] it must have the input's extents but ceil({} / {}) on the axis",
                    fmt::join(vx, ","), block, a, fmt::join(xs, ","), xs[a], block));
  I64s un = vx;  // [.., B, ..] -> [.., B, 1, ..] -> [.., B, block, ..] -> [.., B * block, ..] -> [.., D, ..]
  un.insert(un.begin() + std::ptrdiff_t(a) + 1, 1);
  I64s wide = un;
  wide[a + 1] = block;
  I64s flat = vx;
  flat[a] *= block;
  auto rep = c.g.reshape(c.g.expand(c.g.reshape(v, un), ir::Shape(wide)), flat);
  return c.g.slice(rep, {std::int64_t(a)}, {0}, {xs[a]});
}

// round-half-even(x / scale) + zero point, saturated and cast to the quantized type. A float8 or float4 type
// takes x / scale + zero point as it is, cast with its own rounding (`saturate`: ONNX's attribute).
NodeId quantize(Ctx& c, NodeId x, NodeId scale, std::optional<NodeId> zp, ir::DType qt, bool saturate = true) {
  auto xf = cast_to(c, x, ir::DType::F32);
  auto y = c.g.div(xf, cast_to(c, scale, ir::DType::F32));
  if (ir::is_storage_float(qt)) {
    if (zp) y = c.g.add(y, cast_to(c, *zp, ir::DType::F32));
    ir::Attrs a;
    a.set("to", qt);
    if (!saturate) a.set("saturate", false);
    return c.g.add(OpKind::Cast, {y}, a);
  }
  auto [lo, hi] = qrange(c, qt);
  y = c.g.unary(OpKind::Round, y);
  if (zp) y = c.g.add(y, cast_to(c, *zp, ir::DType::F32));
  return c.g.cast(c.g.clamp(y, lo, hi), qt);
}

// [B, S, H*D] -> [B, H, S, D]
NodeId heads(Ctx& c, NodeId x, std::int64_t h) {
  const auto sh = ext(c, x);
  if (h <= 0 || sh[2] % h != 0) c.fail("q_num_heads / kv_num_heads must divide the hidden size");
  return c.g.permute(c.g.reshape(x, I64s{sh[0], sh[1], h, sh[2] / h}), {0, 2, 1, 3});
}

// ONNX's Attention (opset 23+), as its reference computes it: scaled scores (the scale's square root on
// each side), an additive bias from the mask, causality, a sliding window and unpadded lengths, softcap,
// a softmax that leaves fully masked rows at zero, and grouped KV heads repeated.
Outs attention(Ctx& c) {
  auto q = c.in(0), kk = c.in(1), v = c.in(2);
  // f16 and bf16 run in f32 and round once at the end, as a fused kernel would.
  const auto io_dt = c.dtype(0);
  const bool half = io_dt == ir::DType::F16 || io_dt == ir::DType::BF16;
  auto widen = [&](NodeId x) { return half ? c.g.cast(x, ir::DType::F32) : x; };
  auto narrow = [&](NodeId x) { return half ? c.g.cast(x, io_dt) : x; };
  q = widen(q);
  kk = widen(kk);
  v = widen(v);
  const bool three_d = c.rank(0) == 3;
  if (c.rank(1) != c.rank(0) || c.rank(2) != c.rank(0)) c.fail("Q, K and V must have the same rank");
  if (c.has(3) && c.rank(3) < 1) c.fail("attn_mask must have rank >= 1");
  if ((c.has(4) && c.rank(4) != 4) || (c.has(5) && c.rank(5) != 4)) c.fail("past_key and past_value must be 4-D");
  if (three_d) {
    q = heads(c, q, c.attr_int("q_num_heads"));
    kk = heads(c, kk, c.attr_int("kv_num_heads"));
    v = heads(c, v, c.attr_int("kv_num_heads"));
  } else if (c.rank(0) != 4) {
    c.fail("Q, K and V must be 3-D or 4-D");
  }
  const auto dt = c.g.node(q).dtype;
  const double inf = std::numeric_limits<double>::infinity();
  auto qs = ext(c, q);
  const double scale = c.attr_float("scale", 1.0 / std::sqrt(double(qs[3])));
  auto sq = c.g.scalar(std::sqrt(scale), dt);
  const std::int64_t past = c.has(4) ? ext(c, c.in(4))[2] : 0;
  if (c.has(4)) kk = c.g.concat({widen(c.in(4)), kk}, 2);
  if (c.has(5)) v = c.g.concat({widen(c.in(5)), v}, 2);
  const auto present_k = kk, present_v = v;
  const std::int64_t b = qs[0], hq = qs[1], lq = qs[2], lk = ext(c, kk)[2], hk = ext(c, kk)[1];
  // The additive bias [.., lq, lk].
  auto zero = c.g.scalar(0, dt), minus_inf = c.g.scalar(-inf, dt);
  std::optional<NodeId> bias;
  if (c.has(3)) {
    auto m = c.in(3);
    const auto ms = ext(c, m);
    const bool is_bool = c.dtype(3) == ir::DType::Bool;
    if (ms.back() < lk) {
      I64s p(2 * ms.size(), 0);
      p[2 * ms.size() - 1] = lk - ms.back();
      m = c.g.pad(m, p, is_bool ? 0.0 : -inf);
    }
    bias = is_bool ? c.g.where(m, zero, minus_inf) : cast_to(c, m, dt);  // dt is f32 for half types
  }
  auto row = c.g.iota(ir::Shape({lq, lk}), 0, ir::DType::I64), col = c.g.iota(ir::Shape({lq, lk}), 1, ir::DType::I64);
  // diff = (i + offset) - j; offset is the past length, or per batch nonpad_kv_seqlen - lq.
  NodeId diff = c.g.sub(row, col);
  const bool nonpad = c.has(6);
  if (nonpad) {
    auto off = c.g.sub(c.g.cast(c.in(6), ir::DType::I64), c.g.scalar(double(lq), ir::DType::I64));
    diff = c.g.add(c.g.reshape(diff, I64s{1, 1, lq, lk}), c.g.reshape(off, I64s{b, 1, 1, 1}));
  } else if (past) {
    diff = c.g.add(diff, c.g.scalar(double(past), ir::DType::I64));
  }
  auto add_bias = [&](NodeId allowed) {
    auto term = c.g.where(allowed, zero, minus_inf);
    bias = bias ? c.g.add(*bias, term) : term;
  };
  auto i64 = [&](double x) { return c.g.scalar(x, ir::DType::I64); };
  if (c.attr_int("is_causal", 0) != 0) add_bias(c.g.binary(OpKind::Ge, diff, i64(0)));
  const auto left = c.attr_int("left_window_size", -1), right = c.attr_int("right_window_size", -1);
  if (left >= 0) add_bias(c.g.binary(OpKind::Le, diff, i64(double(left))));
  if (right >= 0) add_bias(c.g.binary(OpKind::Ge, diff, i64(-double(right))));
  if (nonpad) {
    auto keep = c.g.binary(OpKind::Lt, c.g.iota(ir::Shape({b, 1, 1, lk}), 3, ir::DType::I64),
                           c.g.reshape(c.g.cast(c.in(6), ir::DType::I64), I64s{b, 1, 1, 1}));
    add_bias(keep);
  }
  if (hq != hk) {  // grouped KV heads: each repeated for its group of query heads
    if (hk <= 0 || hq % hk != 0) c.fail("the query heads are not a multiple of the KV heads");
    auto repeat = [&](NodeId x) {
      auto xs = ext(c, x);
      auto e = c.g.expand(c.g.reshape(x, I64s{xs[0], xs[1], 1, xs[2], xs[3]}),
                          ir::Shape(I64s{xs[0], xs[1], hq / hk, xs[2], xs[3]}));
      return c.g.reshape(e, I64s{xs[0], hq, xs[2], xs[3]});
    };
    kk = repeat(kk);
    v = repeat(v);
  }
  auto qk = c.g.matmul(c.g.mul(q, sq), c.g.transpose(c.g.mul(kk, sq)));
  const double softcap = c.attr_float("softcap", 0.0);
  if (softcap > 0) qk = c.g.mul(c.g.unary(OpKind::Tanh, c.g.div(qk, c.g.scalar(softcap, dt))), c.g.scalar(softcap, dt));
  auto with_bias = bias ? c.g.add(qk, *bias) : qk;
  const auto mode = c.attr_int("qk_matmul_output_mode", 0);
  NodeId qk_out = mode == 2 ? with_bias : qk;
  auto x = with_bias;
  if (c.has_attr("softmax_precision")) {
    auto sp = dtype_of(c.attr_int("softmax_precision"));
    if (!sp) c.fail("softmax_precision names a type RLX lacks");
    x = cast_to(c, x, *sp);
  }
  // A softmax that maps a row of -inf to zeros instead of NaN.
  const auto xdt = c.g.node(x).dtype;
  auto mx = c.g.reduce(OpKind::ReduceMax, x, {-1}, true);
  auto safe = c.g.where(c.g.binary(OpKind::Eq, mx, c.g.scalar(-inf, xdt)), c.g.scalar(0, xdt), mx);
  auto e = c.g.exp(c.g.sub(x, safe));
  auto sum = c.g.sum(e, {-1}, true);
  auto p = c.g.div(e, c.g.where(c.g.binary(OpKind::Eq, sum, c.g.scalar(0, xdt)), c.g.scalar(1, xdt), sum));
  if (bias) {
    auto bmax = c.g.reduce(OpKind::ReduceMax, *bias, {-1}, true);
    p = c.g.where(c.g.binary(OpKind::Eq, bmax, minus_inf), c.g.scalar(0, xdt), p);
  }
  p = cast_to(c, p, dt);
  if (mode == 3) qk_out = p;
  auto y = c.g.matmul(p, v);
  if (three_d) {
    auto ys = ext(c, y);
    y = c.g.reshape(c.g.permute(y, {0, 2, 1, 3}), I64s{ys[0], ys[2], ys[1] * ys[3]});
  }
  return {narrow(y), narrow(present_k), narrow(present_v), narrow(qk_out)};
}

}  // namespace

void register_nn(Table& t) {
  t["Attention"] = {[](Ctx& c) -> Outs { return attention(c); }};
  t["MatMul"] = {[](Ctx& c) -> Outs { return {matmul(c, c.in(0), c.in(1))}; }};
  t["Gemm"] = {[](Ctx& c) -> Outs {
    auto a = c.in(0), b = c.in(1);
    if (c.rank(0) != 2 || c.rank(1) != 2) c.fail("A and B must be 2-D");
    if (c.attr_int("transA", 0)) a = c.g.transpose(a);
    if (c.attr_int("transB", 0)) b = c.g.transpose(b);
    auto y = c.g.matmul(a, b);
    const double alpha = c.attr_float("alpha", 1.0), beta = c.attr_float("beta", 1.0);
    if (alpha != 1.0) y = c.g.mul(y, k(c, alpha, y));
    if (c.has(2) && beta != 0.0) {
      auto cc = c.in(2);
      if (beta != 1.0) cc = c.g.mul(cc, k(c, beta, cc));
      y = c.g.add(y, cc);
    }
    return {y};
  }};
  t["Softmax"] = {
      [](Ctx& c) -> Outs { return {over_axis(c, [&](NodeId x, std::int64_t a) { return c.g.softmax(x, a); })}; }};
  t["LogSoftmax"] = {
      [](Ctx& c) -> Outs { return {over_axis(c, [&](NodeId x, std::int64_t a) { return c.g.log_softmax(x, a); })}; }};
  t["Hardmax"] = {
      [](Ctx& c) -> Outs { return {over_axis(c, [&](NodeId x, std::int64_t a) { return hardmax(c, x, a); })}; }};
  t["LayerNormalization"] = {[](Ctx& c) -> Outs {
    const auto r = c.rank(0);
    const auto axis = axis_of(c, c.attr_int("axis", -1), r);
    const double eps = c.attr_float("epsilon", 1e-5);
    const auto sh = c.dims(0).dims();
    const ir::Shape norm(std::vector<ir::Dim>(sh.begin() + axis, sh.end()));
    // gamma and beta broadcast against the normalized dims; RLX's layer_norm wants them whole.
    auto full = [&](NodeId v) { return c.g.node(v).shape == norm ? v : c.g.expand(v, norm); };
    std::optional<NodeId> gamma, beta;
    if (c.has(1)) gamma = full(c.in(1));
    if (c.has(2)) beta = full(c.in(2));
    if (beta && !gamma) c.fail("B without Scale");
    auto y = c.g.layer_norm(c.in(0), gamma, beta, eps, axis);
    if (c.num_outputs() == 1) return {y};
    // The optional Mean and InvStdDev outputs, over the same axes, kept as dims of 1.
    I64s axes;
    for (auto i = axis; i < std::int64_t(r); ++i) axes.push_back(i);
    auto x = c.in(0);
    auto mean = c.g.mean(x, axes, true);
    auto centered = c.g.sub(x, mean);
    auto var = c.g.mean(c.g.mul(centered, centered), axes, true);
    return {y, mean, c.g.unary(OpKind::Rsqrt, c.g.add(var, k(c, eps, var)))};
  }};
  t["RMSNormalization"] = {[](Ctx& c) -> Outs {
    auto x = c.in(0);
    const auto r = c.rank(0);
    const auto axis = axis_of(c, c.attr_int("axis", -1), r);
    I64s axes;
    for (auto i = axis; i < std::int64_t(r); ++i) axes.push_back(i);
    auto ms = c.g.mean(c.g.mul(x, x), axes, true);
    auto y = c.g.mul(x, c.g.unary(OpKind::Rsqrt, c.g.add(ms, k(c, c.attr_float("epsilon", 1e-5), ms))));
    return {c.g.mul(y, c.in(1))};
  }};
  t["BatchNormalization"] = {[](Ctx& c) -> Outs {
    auto x = c.in(0);
    const auto r = c.rank(0);
    if (r < 2) c.fail("the input must be [N, C, ...]");
    auto pc = [&](std::size_t i) { return per_channel(c, c.in(i), r); };
    const auto eps = k(c, c.attr_float("epsilon", 1e-5), x);
    if (c.attr_int("training_mode", 0) == 0) {
      auto inv = c.g.unary(OpKind::Rsqrt, c.g.add(pc(4), eps));
      return {c.g.add(c.g.mul(c.g.mul(c.g.sub(x, pc(3)), inv), pc(1)), pc(2))};
    }
    // Training mode (opset 14+): normalized with the batch's statistics (the population variance), and
    // the running mean and variance moved toward them by 1 - momentum.
    I64s axes{0};
    for (std::size_t i = 2; i < r; ++i) axes.push_back(std::int64_t(i));
    auto mean = c.g.mean(x, axes, true);
    auto centered = c.g.sub(x, mean);
    auto var = c.g.mean(c.g.mul(centered, centered), axes, true);
    auto y = c.g.add(c.g.mul(c.g.mul(centered, c.g.unary(OpKind::Rsqrt, c.g.add(var, eps))), pc(1)), pc(2));
    const double momentum = c.attr_float("momentum", 0.9);
    auto running = [&](std::size_t i, NodeId batch) {
      auto b = c.g.reshape(batch, I64s{c.shape(0)[1]});
      auto prev = cast_to(c, c.in(i), c.g.node(b).dtype);
      return cast_to(c, c.g.add(c.g.mul(prev, k(c, momentum, b)), c.g.mul(b, k(c, 1 - momentum, b))), c.dtype(i));
    };
    return {y, running(3, mean), running(4, var)};
  }};
  t["InstanceNormalization"] = {[](Ctx& c) -> Outs {
    auto x = c.in(0);
    const auto r = c.rank(0);
    I64s axes;
    for (std::size_t i = 2; i < r; ++i) axes.push_back(std::int64_t(i));
    auto centered = c.g.sub(x, c.g.mean(x, axes, true));
    auto var = c.g.mean(c.g.mul(centered, centered), axes, true);
    auto y = c.g.mul(centered, c.g.unary(OpKind::Rsqrt, c.g.add(var, k(c, c.attr_float("epsilon", 1e-5), x))));
    return {c.g.add(c.g.mul(y, per_channel(c, c.in(1), r)), per_channel(c, c.in(2), r))};
  }};
  t["GroupNormalization"] = {[](Ctx& c) -> Outs {
    auto x = c.in(0);
    const auto sh = c.shape(0);
    const auto groups = c.attr_int("num_groups");
    if (sh.size() < 2 || groups <= 0 || sh[1] % groups != 0) c.fail("num_groups must divide the channels");
    const auto ch = sh[1];
    if (c.rank(1) != 1) c.fail("scale must be 1-D");
    if (c.opset() < 21 && ext(c, c.in(1))[0] != ch) c.fail("per-group scale (opset 18) is not supported");
    auto y = c.g.group_norm(x, groups, std::nullopt, std::nullopt, c.attr_float("epsilon", 1e-5));
    return {c.g.add(c.g.mul(y, per_channel(c, c.in(1), sh.size())), per_channel(c, c.in(2), sh.size()))};
  }};
  t["LpNormalization"] = {[](Ctx& c) -> Outs {
    auto x = c.in(0);
    const auto axis = axis_of(c, c.attr_int("axis", -1), c.rank(0));
    const auto p = c.attr_int("p", 2);
    NodeId n;
    if (p == 1)
      n = c.g.sum(c.g.unary(OpKind::Abs, x), {axis}, true);
    else if (p == 2)
      n = c.g.unary(OpKind::Sqrt, c.g.sum(c.g.mul(x, x), {axis}, true));
    else
      c.fail(fmt::format("p = {} (only 1 and 2)", p));
    // A zero norm leaves its zeros (ONNX's reference), not 0/0.
    auto zero = k(c, 0, n);
    return {c.g.div(x, c.g.where(c.g.binary(OpKind::Eq, n, zero), k(c, 1, n), n))};
  }};
  t["MeanVarianceNormalization"] = {[](Ctx& c) -> Outs {
    auto x = c.in(0);
    auto axes = c.attr_ints("axes", {0, 2, 3});
    for (auto& a : axes) a = axis_of(c, a, c.rank(0));
    auto centered = c.g.sub(x, c.g.mean(x, axes, true));
    auto var = c.g.mean(c.g.mul(centered, centered), axes, true);
    return {c.g.div(centered, c.g.add(c.g.unary(OpKind::Sqrt, var), k(c, 1e-9, x)))};
  }};
  t["Dropout"] = {[](Ctx& c) -> Outs {
    // Inference: the identity, and a mask of all true.
    // Training mode with a ratio of 0 drops nothing: the identity too.
    const double ratio = c.has(1) ? c.scalar(1, "ratio") : 0.5;
    if (c.has(2) && c.scalar(2, "training_mode") != 0 && ratio != 0)
      c.fail("training_mode with a non-zero ratio is not supported (inference only)");
    auto x = c.in(0);
    return {x, c.g.expand(c.g.scalar(1, ir::DType::Bool), c.g.node(x).shape)};
  }};
  t["Conv"] = {[](Ctx& c) -> Outs {
    std::optional<NodeId> bias;
    if (c.has(2)) bias = c.in(2);
    return {conv(c, c.in(0), c.in(1), bias)};
  }};
  t["ConvInteger"] = {[](Ctx& c) -> Outs {
    // In f64, exact: the products are below 2^16 and their sums far below 2^53.
    auto x = c.g.cast(c.in(0), ir::DType::F64), w = c.g.cast(c.in(1), ir::DType::F64);
    if (c.has(2)) x = c.g.sub(x, c.g.cast(c.in(2), ir::DType::F64));
    if (c.has(3)) w = c.g.sub(w, along(c, c.g.cast(c.in(3), ir::DType::F64), 0, w));
    return {c.g.cast(conv(c, x, w, std::nullopt), ir::DType::I32)};
  }};
  t["QLinearConv"] = {[](Ctx& c) -> Outs {
    auto deq = [&](std::size_t v, std::size_t sc, std::size_t z, std::int64_t axis) {
      return c.g.mul(
          c.g.sub(c.g.cast(c.in(v), ir::DType::F32), along(c, c.g.cast(c.in(z), ir::DType::F32), axis, c.in(v))),
          along(c, cast_to(c, c.in(sc), ir::DType::F32), axis, c.in(v)));
    };
    auto y = conv(c, deq(0, 1, 2, 1), deq(3, 4, 5, 0), std::nullopt);
    if (c.has(8)) {  // int32 bias in units of x_scale * w_scale
      if (c.rank(8) != 1) c.fail("B must be 1-D");
      auto scale = c.g.mul(cast_to(c, c.in(1), ir::DType::F32), cast_to(c, c.in(4), ir::DType::F32));
      auto b = c.g.mul(c.g.cast(c.in(8), ir::DType::F32), scale);
      y = c.g.add(y, per_channel(c, c.g.reshape(b, I64s{ext(c, c.in(8))[0]}), c.g.node(y).shape.rank()));
    }
    return {quantize(c, y, c.in(6), c.in(7), c.dtype(7))};
  }};
  t["ConvTranspose"] = {[](Ctx& c) -> Outs {
    // A stride-1 convolution of the input with zeros inserted between its elements, padded by
    // dilation * (k - 1) less the pads, with the kernel flipped and its in/out channels swapped.
    auto x = c.in(0);
    const auto sh = c.shape(0), wsh = c.shape(1);
    if (sh.size() < 3 || sh.size() > 5) c.fail("only 1-D, 2-D and 3-D transposed convolutions are supported");
    if (c.rank(1) != sh.size()) c.fail("the weight's rank differs from the input's");
    const std::size_t s = sh.size() - 2;
    const I64s kernel(wsh.begin() + 2, wsh.end());
    const auto group = c.attr_int("group", 1);
    I64s strides = c.attr_ints("strides", I64s(s, 1)), dil = c.attr_ints("dilations", I64s(s, 1)),
         pads = c.attr_ints("pads", I64s(2 * s, 0)), outpad = c.attr_ints("output_padding", I64s(s, 0));
    if (strides.size() != s || dil.size() != s || pads.size() != 2 * s || outpad.size() != s)
      c.fail("strides, dilations, pads and output_padding do not match the kernel's rank");
    const auto out_shape = c.attr_ints("output_shape");
    const auto auto_pad = c.attr_str("auto_pad", "NOTSET");
    for (std::size_t i = 0; i < s; ++i) {
      const std::int64_t full = strides[i] * (sh[2 + i] - 1) + outpad[i] + (kernel[i] - 1) * dil[i] + 1;
      std::int64_t want = -1;
      if (!out_shape.empty())
        want = out_shape[out_shape.size() - s + i];
      else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER")
        want = sh[2 + i] * strides[i];
      if (want >= 0) {
        // A negative total (output_shape past the full extent) pads the end: more zeros, more output.
        const std::int64_t total = out_shape.empty() ? std::max<std::int64_t>(0, full - want) : full - want;
        const bool upper = auto_pad != "SAME_LOWER";
        pads[i] = upper ? total / 2 : total - total / 2;
        pads[s + i] = total - pads[i];
      }
    }
    for (std::size_t i = 0; i < s; ++i) {
      const auto a = std::int64_t(2 + i);
      if (strides[i] > 1) {  // [.., L, ..] -> [.., L, 1, ..] -> [.., L, st, ..] -> [.., (L - 1) * st + 1, ..]
        auto cur = ext(c, x);
        I64s un = cur;
        un.insert(un.begin() + a + 1, 1);
        I64s p(2 * un.size(), 0);
        p[un.size() + std::size_t(a) + 1] = strides[i] - 1;
        x = c.g.pad(c.g.reshape(x, un), p, 0);
        cur[std::size_t(a)] *= strides[i];
        x = c.g.slice(c.g.reshape(x, cur), {a}, {0}, {(sh[2 + i] - 1) * strides[i] + 1});
      }
      const std::int64_t edge = (kernel[i] - 1) * dil[i];
      const std::int64_t before = edge - pads[i], after = edge - pads[s + i] + outpad[i];
      const std::int64_t len = ext(c, x)[std::size_t(a)];
      x = c.g.slice(x, {a}, {std::max<std::int64_t>(0, -before)}, {len - std::max<std::int64_t>(0, -after)});
      I64s p(2 * sh.size(), 0);
      p[std::size_t(a)] = std::max<std::int64_t>(0, before);
      p[sh.size() + std::size_t(a)] = std::max<std::int64_t>(0, after);
      x = c.g.pad(x, p, 0);
    }
    // w [C, M/g, k..] -> [M, C/g, k..], flipped.
    const std::int64_t ch = wsh[0], mg = wsh[1];
    if (group <= 0 || ch % group != 0) c.fail("group must divide the input channels");
    I64s w5{group, ch / group, mg};
    w5.insert(w5.end(), kernel.begin(), kernel.end());
    I64s perm{0, 2, 1};
    for (std::size_t i = 0; i < s; ++i) perm.push_back(std::int64_t(3 + i));
    auto w = c.g.permute(c.g.reshape(c.in(1), w5), perm);
    I64s w4{group * mg, ch / group};
    w4.insert(w4.end(), kernel.begin(), kernel.end());
    w = c.g.reshape(w, w4);
    I64s flip_axes;
    for (std::size_t i = 0; i < s; ++i) flip_axes.push_back(std::int64_t(2 + i));
    w = c.g.flip(w, flip_axes);
    std::optional<NodeId> bias;
    if (c.has(2)) bias = c.in(2);
    if (s == 1) return {c.g.conv1d(x, w, bias, 1, 0, dil[0], group)};
    if (s == 3) return {conv3d(c, x, w, bias, {1, 1, 1}, {0, 0}, dil, group)};
    return {c.g.conv2d(x, w, bias, {1, 1}, {0, 0}, dil, group)};
  }};
  t["MaxPool"] = {[](Ctx& c) -> Outs {
    if (c.num_outputs() < 2) return {pool(c, Pool::Max)};
    std::optional<NodeId> indices;
    auto y = pool(c, Pool::Max, &indices);
    return {y, indices};
  }};
  t["AveragePool"] = {[](Ctx& c) -> Outs { return {pool(c, Pool::Average)}; }};
  t["LpPool"] = {[](Ctx& c) -> Outs { return {pool(c, Pool::Lp)}; }};
  t["GlobalLpPool"] = {[](Ctx& c) -> Outs {
    auto x = c.in(0);
    const double p = double(c.attr_int("p", 2));
    I64s axes;
    for (std::size_t i = 2; i < c.rank(0); ++i) axes.push_back(std::int64_t(i));
    auto s = c.g.sum(c.g.binary(OpKind::Pow, c.g.unary(OpKind::Abs, x), k(c, p, x)), axes, true);
    return {c.g.binary(OpKind::Pow, s, k(c, 1.0 / p, s))};
  }};
  t["LRN"] = {[](Ctx& c) -> Outs {
    // x / (bias + alpha / size * sum of squares over a window of channels)^beta.
    auto x = c.in(0);
    const auto sh = c.shape(0);
    if (sh.size() < 3) c.fail("the input must be [N, C, spatial...]");
    const std::int64_t size = c.attr_int("size");
    if (size <= 0 || size > 1024) c.fail("size must be in [1, 1024]");
    const double alpha = c.attr_float("alpha", 1e-4), beta = c.attr_float("beta", 0.75),
                 bias = c.attr_float("bias", 1.0);
    I64s pads(2 * sh.size(), 0);
    pads[1] = (size - 1) / 2;
    pads[sh.size() + 1] = size - 1 - (size - 1) / 2;
    auto sq = c.g.pad(c.g.mul(x, x), pads, 0);
    std::optional<NodeId> acc;
    for (std::int64_t i = 0; i < size; ++i) {
      auto part = c.g.slice(sq, {1}, {i}, {i + sh[1]});
      acc = acc ? c.g.add(*acc, part) : part;
    }
    auto den = c.g.add(c.g.mul(*acc, k(c, alpha / double(size), x)), k(c, bias, x));
    return {c.g.div(x, c.g.binary(OpKind::Pow, den, k(c, beta, x)))};
  }};
  t["GlobalAveragePool"] = {[](Ctx& c) -> Outs {
    I64s axes;
    for (std::size_t i = 2; i < c.rank(0); ++i) axes.push_back(std::int64_t(i));
    return {c.g.mean(c.in(0), axes, true)};
  }};
  t["GlobalMaxPool"] = {[](Ctx& c) -> Outs {
    I64s axes;
    for (std::size_t i = 2; i < c.rank(0); ++i) axes.push_back(std::int64_t(i));
    return {c.g.reduce(OpKind::ReduceMax, c.in(0), axes, true)};
  }};

  // Opset 10 is per tensor; 13 adds per-axis `axis`; 21 adds `block_size` and QuantizeLinear's
  // `output_dtype`; 23 adds DequantizeLinear's `output_dtype`. (`saturate` concerns float8 only.)
  t["QuantizeLinear"] = {[](Ctx& c) -> Outs {
    const auto axis = c.attr_int("axis", 1), block = c.attr_int("block_size", 0);
    if (block < 0) c.fail(fmt::format("block_size is {}; it must be >= 0", block));
    ir::DType qt = c.has(2) ? c.dtype(2) : ir::DType::U8;
    if (c.attr_int("output_dtype", 0) != 0) {
      auto d = dtype_of(c.attr_int("output_dtype"));
      if (!d) c.fail("output_dtype names a type RLX lacks");
      if (c.has(2) && *d != qt) c.fail("output_dtype differs from the zero point's type");
      qt = *d;
    }
    std::optional<NodeId> zp;
    if (c.has(2)) zp = along(c, c.in(2), axis, c.in(0), block);
    return {quantize(c, c.in(0), along(c, c.in(1), axis, c.in(0), block), zp, qt, c.attr_int("saturate", 1) != 0)};
  }};
  t["DequantizeLinear"] = {[](Ctx& c) -> Outs {
    const auto axis = c.attr_int("axis", 1), block = c.attr_int("block_size", 0);
    if (block < 0) c.fail(fmt::format("block_size is {}; it must be >= 0", block));
    const auto xt = c.dtype(0);
    // int32 too: a quantized bias. The storage-only types (float8, float4, int4, int2) cast like the others.
    if ((!ir::is_integer(xt) && !ir::is_storage_only(xt)) || xt == ir::DType::I64 || xt == ir::DType::U64)
      c.fail(
          fmt::format("x is {}; it must be an 8-, 16- or 32-bit integer, int4, int2 (signed or not), float8 or "
                      "float4e2m1",
                      ir::dtype_name(xt)));
    auto scale = along(c, c.in(1), axis, c.in(0), block);
    const auto ft = c.g.node(scale).dtype;
    if (!ir::is_float(ft)) c.fail("the scale must be a float tensor");
    auto x = c.g.cast(c.in(0), ft);
    if (c.has(2)) x = c.g.sub(x, c.g.cast(along(c, c.in(2), axis, c.in(0), block), ft));
    auto y = c.g.mul(x, scale);
    if (c.attr_int("output_dtype", 0) != 0) {
      auto d = dtype_of(c.attr_int("output_dtype"));
      if (!d || !ir::is_float(*d)) c.fail("output_dtype must name a float type RLX has");
      y = cast_to(c, y, *d);
    }
    return {y};
  }};
  t["DynamicQuantizeLinear"] = {[](Ctx& c) -> Outs {
    // The uint8 affine quantization of x over its whole range, 0 included (ONNX's formula).
    auto x = c.in(0);
    I64s all(c.rank(0));
    std::iota(all.begin(), all.end(), 0);
    auto zero = k(c, 0, x);
    auto mn = c.g.binary(OpKind::Min, c.g.reduce(OpKind::ReduceMin, x, all), zero);
    auto mx = c.g.binary(OpKind::Max, c.g.reduce(OpKind::ReduceMax, x, all), zero);
    auto scale = c.g.div(c.g.sub(mx, mn), k(c, 255, x));
    auto zp_f = c.g.clamp(c.g.unary(OpKind::Round, c.g.div(c.g.unary(OpKind::Neg, mn), scale)), 0, 255);
    auto zp = c.g.cast(zp_f, ir::DType::U8);
    return {quantize(c, x, scale, zp, ir::DType::U8), scale, zp};
  }};
  t["MatMulInteger"] = {[](Ctx& c) -> Outs {
    // Exact in f64 (|products| < 2^16, sums far below 2^53), then int32 as ONNX's result type.
    auto a = c.g.cast(c.in(0), ir::DType::F64), b = c.g.cast(c.in(1), ir::DType::F64);
    if (c.has(2))
      a = c.g.sub(a,
                  c.g.cast(c.rank(2) == 1 && c.rank(0) >= 1 ? c.g.unsqueeze(c.in(2), {1}) : c.in(2), ir::DType::F64));
    if (c.has(3)) b = c.g.sub(b, c.g.cast(c.in(3), ir::DType::F64));
    return {c.g.cast(matmul(c, a, b), ir::DType::I32)};
  }};
  t["QLinearMatMul"] = {[](Ctx& c) -> Outs {
    auto deq = [&](std::size_t v, std::size_t s, std::size_t z) {
      return c.g.mul(c.g.sub(c.g.cast(c.in(v), ir::DType::F32), c.g.cast(c.in(z), ir::DType::F32)),
                     cast_to(c, c.in(s), ir::DType::F32));
    };
    auto y = matmul(c, deq(0, 1, 2), deq(3, 4, 5));
    return {quantize(c, y, c.in(6), c.in(7), c.dtype(7))};
  }};
}

}  // namespace rlx::onnx::detail
