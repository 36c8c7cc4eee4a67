// matmul and the HIR composites, evaluated directly (never through their
// decomposition) so that they check it.
#include <algorithm>
#include <cmath>

#include "reference/value.hpp"

namespace rlx::reference::detail {
namespace {

using ir::OpKind;

struct Split {
  std::int64_t outer = 1, n = 1, inner = 1;
};
// [outer, n, inner] around `axis`.
Split split_at(const Ext& e, std::size_t axis) {
  Split s;
  for (std::size_t d = 0; d < e.size(); ++d) (d < axis ? s.outer : d == axis ? s.n : s.inner) *= e[d];
  return s;
}

Value softmax(const Ctx& c, const Value& x, bool log) {
  // A scalar is a row of one.
  auto axis = x.rank() ? std::size_t(c.axis(c.attrs().int_or("axis", -1), x.rank())) : 0;
  const Split s = split_at(x.ext, axis);
  Value r(c.n.dtype, x.ext);
  for (std::int64_t o = 0; o < s.outer; ++o)
    for (std::int64_t i = 0; i < s.inner; ++i) {
      const double* p = x.v.data() + o * s.n * s.inner + i;
      double* q = r.v.data() + o * s.n * s.inner + i;
      double m = -INFINITY, sum = 0;
      for (std::int64_t k = 0; k < s.n; ++k) m = std::fmax(m, p[k * s.inner]);
      for (std::int64_t k = 0; k < s.n; ++k) sum += std::exp(p[k * s.inner] - m);
      for (std::int64_t k = 0; k < s.n; ++k)
        q[k * s.inner] = log ? p[k * s.inner] - m - std::log(sum) : std::exp(p[k * s.inner] - m) / sum;
    }
  return r;
}

// Normalizes rows of `m` trailing elements; gamma/beta broadcast over a row.
Value normalize(const Ctx& c, const Value& x, std::size_t axis, bool rms, const Value* gamma, const Value* beta) {
  Ext row(x.ext.begin() + std::ptrdiff_t(axis), x.ext.end());
  std::int64_t m = numel(row), rows = numel(Ext(x.ext.begin(), x.ext.begin() + std::ptrdiff_t(axis)));
  std::vector<std::int64_t> mg, mb;
  if (gamma) mg = broadcast_map(c, gamma->ext, row);
  if (beta) mb = broadcast_map(c, beta->ext, row);
  double eps = c.attrs().get_float("eps");
  Value r(c.n.dtype, x.ext);
  for (std::int64_t i = 0; i < rows; ++i) {
    const double* p = x.v.data() + i * m;
    double mean = 0, var = 0;
    if (!rms) {
      for (std::int64_t j = 0; j < m; ++j) mean += p[j];
      mean /= double(m);
    }
    for (std::int64_t j = 0; j < m; ++j) var += (p[j] - mean) * (p[j] - mean);
    double inv = 1 / std::sqrt(var / double(m) + eps);
    for (std::int64_t j = 0; j < m; ++j) {
      double y = (p[j] - mean) * inv;
      if (gamma) y *= gamma->v[mg[j]];
      if (beta) y += beta->v[mb[j]];
      r.v[std::size_t(i * m + j)] = y;
    }
  }
  return r;
}

// The backward of softmax (log: of log_softmax) from its result y and the
// cotangent dy: y (dy - sum(dy y)), or dy - exp(y) sum(dy).
Value softmax_backward(const Ctx& c, const Value& y, const Value& dy, bool log) {
  auto axis = y.rank() ? std::size_t(c.axis(c.attrs().get_int("axis"), y.rank())) : 0;
  const Split s = split_at(y.ext, axis);
  Value r(c.n.dtype, y.ext);
  for (std::int64_t o = 0; o < s.outer; ++o)
    for (std::int64_t i = 0; i < s.inner; ++i) {
      auto at = [&](std::int64_t k) { return std::size_t(o * s.n * s.inner + i + k * s.inner); };
      double sum = 0;
      for (std::int64_t k = 0; k < s.n; ++k) sum += log ? dy.v[at(k)] : dy.v[at(k)] * y.v[at(k)];
      for (std::int64_t k = 0; k < s.n; ++k)
        r.v[at(k)] = log ? dy.v[at(k)] - std::exp(y.v[at(k)]) * sum : y.v[at(k)] * (dy.v[at(k)] - sum);
    }
  return r;
}

// The backward of layer_norm (rms: of rms_norm) with respect to x, per row of
// m elements with xhat = (x - mean) r and g = dy gamma:
// r (g - mean(g) - xhat mean(g xhat)), without the mean terms for rms.
Value normalize_backward(const Ctx& c, const Value& x, const Value& dy, std::size_t axis, bool rms,
                         const Value* gamma) {
  Ext row(x.ext.begin() + std::ptrdiff_t(axis), x.ext.end());
  std::int64_t m = numel(row), rows = numel(Ext(x.ext.begin(), x.ext.begin() + std::ptrdiff_t(axis)));
  std::vector<std::int64_t> mg;
  if (gamma) mg = broadcast_map(c, gamma->ext, row);
  double eps = c.attrs().get_float("eps");
  Value r(c.n.dtype, x.ext);
  std::vector<double> xhat(static_cast<std::size_t>(m)), g(static_cast<std::size_t>(m));
  for (std::int64_t i = 0; i < rows; ++i) {
    const double *p = x.v.data() + i * m, *d = dy.v.data() + i * m;
    double mean = 0, var = 0, mean_g = 0, mean_gx = 0;
    if (!rms) {
      for (std::int64_t j = 0; j < m; ++j) mean += p[j];
      mean /= double(m);
    }
    for (std::int64_t j = 0; j < m; ++j) var += (p[j] - mean) * (p[j] - mean);
    double inv = 1 / std::sqrt(var / double(m) + eps);
    for (std::size_t j = 0; j < std::size_t(m); ++j) {
      xhat[j] = (p[j] - mean) * inv;
      g[j] = gamma ? d[j] * gamma->v[std::size_t(mg[j])] : d[j];
      mean_g += g[j];
      mean_gx += g[j] * xhat[j];
    }
    mean_g = rms ? 0 : mean_g / double(m);
    mean_gx /= double(m);
    for (std::size_t j = 0; j < std::size_t(m); ++j)
      r.v[std::size_t(i * m) + j] = inv * (g[j] - mean_g - xhat[j] * mean_gx);
  }
  return r;
}

Value linear(const Ctx& c, const Value& x, const Value& w, const Value* b) {
  if (w.rank() != 2 || x.rank() < 1 || x.ext.back() != w.ext[0])
    c.fail("linear needs x[..., in] and w[in, out], got " + ext_str(x.ext) + " and " + ext_str(w.ext));
  std::int64_t in = w.ext[0], out = w.ext[1];
  Ext oe = x.ext;
  oe.back() = out;
  std::int64_t rows = numel(Ext(x.ext.begin(), x.ext.end() - 1));
  Value r(c.n.dtype, oe);
  std::vector<std::int64_t> mb;
  if (b) mb = broadcast_map(c, b->ext, oe);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < out; ++j) {
      double acc = 0;
      for (std::int64_t k = 0; k < in; ++k) acc += x.v[i * in + k] * w.v[k * out + j];
      std::size_t at = std::size_t(i * out + j);
      r.v[at] = b ? acc + b->v[mb[at]] : acc;
    }
  return r;
}

// conv1d/conv2d over x[N, C, spatial...] and w[O, C/groups, kernel...].
Value conv(const Ctx& c, const Value& x, const Value& w, const Value* b, std::size_t nsp) {
  if (x.rank() != nsp + 2 || w.rank() != nsp + 2)
    c.fail("conv needs input and weight of rank " + std::to_string(nsp + 2) + ", got " + ext_str(x.ext) + " and " +
           ext_str(w.ext));
  std::int64_t N = x.ext[0], C = x.ext[1], O = w.ext[0], Cg = w.ext[1], G = c.attrs().int_or("groups", 1);
  if (G < 1 || C % G || O % G || Cg != C / G)
    c.fail("conv channels: input " + ext_str(x.ext) + ", weight " + ext_str(w.ext) + ", groups " + std::to_string(G));
  Ext stride = c.ints_n("stride", Ext(nsp, 1)), pad = c.ints_n("padding", Ext(nsp, 0)),
      dil = c.ints_n("dilation", Ext(nsp, 1));
  Ext in_sp(x.ext.begin() + 2, x.ext.end()), k_sp(w.ext.begin() + 2, w.ext.end()), out_ext{N, O};
  for (std::size_t d = 0; d < nsp; ++d) {
    std::int64_t span = in_sp[d] + 2 * pad[d] - dil[d] * (k_sp[d] - 1) - 1;
    if (span < 0 || stride[d] < 1) c.fail("conv window does not fit the padded input " + ext_str(x.ext));
    out_ext.push_back(span / stride[d] + 1);
  }
  Ext out_sp(out_ext.begin() + 2, out_ext.end());
  auto xs = ir::contiguous_strides(x.ext), ws = ir::contiguous_strides(w.ext);
  Value r(c.n.dtype, out_ext);
  std::int64_t per_group = O / G, n_out = numel(out_sp);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < O; ++o)
      for_each_index(out_sp, [&](const Ext& op, std::int64_t flat) {
        double acc = b ? b->v[std::size_t(o)] : 0.0;
        for (std::int64_t ci = 0; ci < Cg; ++ci) {
          std::int64_t ch = (o / per_group) * Cg + ci;
          for_each_index(k_sp, [&](const Ext& kp, std::int64_t) {
            std::int64_t xo = n * xs[0] + ch * xs[1], wo = o * ws[0] + ci * ws[1];
            for (std::size_t d = 0; d < nsp; ++d) {
              std::int64_t pos = op[d] * stride[d] - pad[d] + kp[d] * dil[d];
              if (pos < 0 || pos >= in_sp[d]) return;
              xo += pos * xs[d + 2];
              wo += kp[d] * ws[d + 2];
            }
            acc += x.v[std::size_t(xo)] * w.v[std::size_t(wo)];
          });
        }
        r.v[std::size_t((n * O + o) * n_out + flat)] = acc;
      });
  return r;
}

// Pools the last two dims. Max ignores padding; avg counts it as zeros.
Value pool(const Ctx& c, const Value& x, bool is_max) {
  if (x.rank() < 2) c.fail("pooling needs rank >= 2, got " + ext_str(x.ext));
  Ext kernel = c.ints_n("kernel", Ext(2, 1)), stride = c.ints_n("stride", kernel), pad = c.ints_n("padding", Ext(2, 0));
  std::int64_t H = x.ext[x.rank() - 2], W = x.ext[x.rank() - 1];
  std::int64_t spans[2] = {H + 2 * pad[0] - kernel[0], W + 2 * pad[1] - kernel[1]};
  if (spans[0] < 0 || spans[1] < 0 || stride[0] < 1 || stride[1] < 1 || kernel[0] < 1 || kernel[1] < 1)
    c.fail("pool window does not fit the padded input " + ext_str(x.ext));
  std::int64_t OH = spans[0] / stride[0] + 1, OW = spans[1] / stride[1] + 1;
  Ext out = x.ext;
  out[x.rank() - 2] = OH;
  out[x.rank() - 1] = OW;
  Value r(c.n.dtype, out);
  std::int64_t planes = numel(Ext(x.ext.begin(), x.ext.end() - 2));
  for (std::int64_t p = 0; p < planes; ++p)
    for (std::int64_t oh = 0; oh < OH; ++oh)
      for (std::int64_t ow = 0; ow < OW; ++ow) {
        double acc = is_max ? -INFINITY : 0.0;
        for (std::int64_t kh = 0; kh < kernel[0]; ++kh)
          for (std::int64_t kw = 0; kw < kernel[1]; ++kw) {
            std::int64_t h = oh * stride[0] - pad[0] + kh, w = ow * stride[1] - pad[1] + kw;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            double v = x.v[std::size_t((p * H + h) * W + w)];
            if (!is_max)
              acc += v;
            else if (!std::isnan(acc) && (std::isnan(v) || v > acc))
              acc = v;  // NaN propagates
          }
        r.v[std::size_t((p * OH + oh) * OW + ow)] = is_max ? acc : acc / double(kernel[0] * kernel[1]);
      }
  return r;
}

Value embedding(const Ctx& c, const Value& table, const Value& ids) {
  if (table.rank() < 1) c.fail("embedding table must have rank >= 1");
  Ext out = ids.ext;
  out.insert(out.end(), table.ext.begin() + 1, table.ext.end());
  std::int64_t row = numel(Ext(table.ext.begin() + 1, table.ext.end()));
  Value r(c.n.dtype, out);
  for (std::size_t i = 0; i < ids.v.size(); ++i)
    std::copy_n(table.v.begin() + c.index(ids.v[i], table.ext[0]) * row, row, r.v.begin() + std::int64_t(i) * row);
  return r;
}

// softmax(q k^T * scale + mask) v over q[..., Sq, D], k[..., Sk, D], v[..., Sk, Dv].
// causal hides key j from query i when j > i (top-left aligned, as torch).
Value attention(const Ctx& c, const Value& q, const Value& k, const Value& v, const Value* mask) {
  if (q.rank() < 2 || k.rank() != q.rank() || v.rank() != q.rank())
    c.fail("attention needs q, k, v of equal rank >= 2");
  std::size_t r2 = q.rank() - 2;
  std::int64_t Sq = q.ext[r2], D = q.ext[r2 + 1], Sk = k.ext[r2], Dv = v.ext[r2 + 1];
  if (k.ext[r2 + 1] != D || v.ext[r2] != Sk)
    c.fail("attention shapes q " + ext_str(q.ext) + ", k " + ext_str(k.ext) + ", v " + ext_str(v.ext) + " disagree");
  auto batch_of = [&](const Value& t) { return Ext(t.ext.begin(), t.ext.begin() + std::ptrdiff_t(r2)); };
  Ext batch = broadcast_ext(c, broadcast_ext(c, batch_of(q), batch_of(k)), batch_of(v));
  auto mq = broadcast_map(c, batch_of(q), batch), mk = broadcast_map(c, batch_of(k), batch),
       mv = broadcast_map(c, batch_of(v), batch);
  Ext scores_ext = batch;
  scores_ext.insert(scores_ext.end(), {Sq, Sk});
  std::vector<std::int64_t> mm;
  if (mask) mm = broadcast_map(c, mask->ext, scores_ext);
  bool bool_mask = mask && mask->dtype == ir::DType::Bool, causal = c.attrs().bool_or("causal", false);
  double scale = c.attrs().float_or("scale", 0.0);
  if (scale == 0) scale = 1 / std::sqrt(double(D));
  Ext out_ext = batch;
  out_ext.insert(out_ext.end(), {Sq, Dv});
  Value r(c.n.dtype, out_ext);
  std::vector<double> s(static_cast<std::size_t>(Sk));
  for (std::size_t b = 0; b < mq.size(); ++b)
    for (std::int64_t i = 0; i < Sq; ++i) {
      const double* qi = q.v.data() + (mq[b] * Sq + i) * D;
      double m = -INFINITY, sum = 0;
      for (std::int64_t j = 0; j < Sk; ++j) {
        const double* kj = k.v.data() + (mk[b] * Sk + j) * D;
        double dot = 0;
        for (std::int64_t d = 0; d < D; ++d) dot += qi[d] * kj[d];
        double sc = dot * scale;
        if (mask) {
          double mval = mask->v[mm[(std::int64_t(b) * Sq + i) * Sk + j]];
          sc = bool_mask ? (mval != 0 ? sc : -INFINITY) : sc + mval;
        }
        if (causal && j > i) sc = -INFINITY;
        s[j] = sc;
        m = std::fmax(m, sc);
      }
      // A fully masked row is 0/0 = NaN, as torch's math attention gives.
      for (auto& e : s) sum += (e = std::exp(e - m));
      double* o = r.v.data() + (std::int64_t(b) * Sq + i) * Dv;
      for (std::int64_t j = 0; j < Sk; ++j) {
        const double* vj = v.v.data() + (mv[b] * Sk + j) * Dv;
        for (std::int64_t d = 0; d < Dv; ++d) o[d] += s[j] / sum * vj[d];
      }
    }
  return r;
}

}  // namespace

Value matmul(const Ctx& c, const Value& a, const Value& b) {
  if (a.rank() < 2 || b.rank() < 2 || a.ext[a.rank() - 1] != b.ext[b.rank() - 2])
    c.fail("matmul needs [..,M,K] x [..,K,N], got " + ext_str(a.ext) + " x " + ext_str(b.ext));
  std::int64_t M = a.ext[a.rank() - 2], K = a.ext[a.rank() - 1], N = b.ext[b.rank() - 1];
  Ext ab(a.ext.begin(), a.ext.end() - 2), bb(b.ext.begin(), b.ext.end() - 2);
  Ext batch = broadcast_ext(c, ab, bb);
  auto ma = broadcast_map(c, ab, batch), mb = broadcast_map(c, bb, batch);
  Ext out = batch;
  out.insert(out.end(), {M, N});
  Value r(c.n.dtype, out);
  for (std::size_t i = 0; i < ma.size(); ++i) {
    const double *pa = a.v.data() + ma[i] * M * K, *pb = b.v.data() + mb[i] * K * N;
    double* pr = r.v.data() + std::int64_t(i) * M * N;
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (std::int64_t k = 0; k < K; ++k) acc += pa[m * K + k] * pb[k * N + n];
        pr[m * N + n] = acc;
      }
  }
  return r;
}

Value eval_nn(const Ctx& c) {
  const Value& x = c.x(0);
  auto opt = [&](std::size_t i) { return i < c.in.size() ? c.in[i] : nullptr; };
  switch (c.n.op) {
    case OpKind::MatMul: return matmul(c, x, c.x(1));
    case OpKind::Linear: return linear(c, x, c.x(1), opt(2));
    case OpKind::Softmax: return softmax(c, x, false);
    case OpKind::LogSoftmax: return softmax(c, x, true);
    case OpKind::LayerNorm:
      return normalize(c, x, x.rank() ? std::size_t(c.axis(c.attrs().int_or("axis", -1), x.rank())) : 0, false, opt(1),
                       opt(2));
    case OpKind::RmsNorm:
      if (x.rank() < 1) c.fail("rms_norm needs rank >= 1");
      return normalize(c, x, x.rank() - 1, true, opt(1), nullptr);
    case OpKind::Conv1d: return conv(c, x, c.x(1), opt(2), 1);
    case OpKind::Conv2d: return conv(c, x, c.x(1), opt(2), 2);
    case OpKind::MaxPool2d: return pool(c, x, true);
    case OpKind::AvgPool2d: return pool(c, x, false);
    case OpKind::Embedding: return embedding(c, x, c.x(1));
    case OpKind::Attention: return attention(c, x, c.x(1), c.x(2), opt(3));
    case OpKind::SoftmaxBackward: return softmax_backward(c, x, c.x(1), false);
    case OpKind::LogSoftmaxBackward: return softmax_backward(c, x, c.x(1), true);
    case OpKind::LayerNormBackward:
      return normalize_backward(c, x, c.x(1), x.rank() ? std::size_t(c.axis(c.attrs().get_int("axis"), x.rank())) : 0,
                                false, opt(2));
    case OpKind::RmsNormBackward:
      if (x.rank() < 1) c.fail("rms_norm_backward needs rank >= 1");
      return normalize_backward(c, x, c.x(1), x.rank() - 1, true, opt(2));
    default: c.fail("not a composite op");
  }
}

}  // namespace rlx::reference::detail
