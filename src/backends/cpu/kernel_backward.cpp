// Native kernels for backward ops the VJP rules emit: softmax_backward,
// layer_norm_backward and rms_norm_backward. Each reads a row (or a block of
// columns) once into cache and writes the input cotangent, where their
// decompositions take two (softmax) to five (layer norm) kernels, each
// streaming the operands again. log_softmax_backward is left to its
// decomposition: its exp runs vectorized there (docs/autodiff.md has the timings).
#include <algorithm>
#include <cmath>

#include "backends/cpu/kernels.hpp"
#include "rlx/error.hpp"

namespace rlx::backends::cpu {

namespace {

using ir::DType;
using ir::OpKind;

constexpr int kLanes = 8;

// dx = y (dy - sum(dy y)) over n elements `inner` apart. The sums run in
// kLanes independent lanes (rows) or per column (slices), so the loops
// vectorize; a single accumulator is a chain the compiler keeps in order.
template <class T>
class SoftmaxBackwardKernel final : public CpuKernel {
 public:
  compile::BufferId y = 0, dy = 0, dx = 0;
  i64 outer = 1, n = 1, inner = 1;
  i64 splits = 1;  // inner > 1: row ranges per slice

  void run(const RunCtx& c) const override {
    const T *yp = at<T>(c, y), *dp = at<T>(c, dy);
    T* xp = at_mut<T>(c, dx);
    if (inner == 1) {
      parallel_for(
          outer, std::max<i64>(1, kGrain / std::max<i64>(n, 1)),
          [&](i64 b, i64 e) {
            for (i64 o = b; o < e; ++o) row(yp + o * n, dp + o * n, xp + o * n);
          },
          c.max_threads);
      return;
    }
    // A slice [n, inner] is read row after row (long contiguous runs); the
    // sums are one vector of `inner`. With fewer slices than threads, each
    // slice's rows are split in `splits` ranges whose partial sums are added.
    const i64 span = (n + splits - 1) / splits;
    auto rows = [&](i64 u, const T* __restrict sum) {
      const i64 o = u / splits, k0 = u % splits * span, k1 = std::min(n, k0 + span);
      for (i64 k = k0; k < k1; ++k) {
        const i64 off = (o * n + k) * inner;
        const T* __restrict yr = yp + off, * __restrict dr = dp + off;
        T* __restrict xr = xp + off;
        for (i64 j = 0; j < inner; ++j) xr[j] = yr[j] * (dr[j] - sum[j]);
      }
    };
    auto partial = [&](i64 u, T* __restrict sum) {
      const i64 o = u / splits, k0 = u % splits * span, k1 = std::min(n, k0 + span);
      std::fill(sum, sum + inner, T(0));
      for (i64 k = k0; k < k1; ++k) {
        const i64 off = (o * n + k) * inner;
        const T* __restrict yr = yp + off, * __restrict dr = dp + off;
        for (i64 j = 0; j < inner; ++j) sum[j] += dr[j] * yr[j];
      }
    };
    if (splits == 1) {
      parallel_for(
          outer, 1,
          [&](i64 b, i64 e) {
            T* sum = reinterpret_cast<T*>(c.thread_scratch());
            for (i64 u = b; u < e; ++u) {
              partial(u, sum);
              rows(u, sum);
            }
          },
          c.max_threads);
      return;
    }
    T* parts = reinterpret_cast<T*>(c.shared);
    parallel_for(
        outer * splits, 1,
        [&](i64 b, i64 e) {
          for (i64 u = b; u < e; ++u) partial(u, parts + u * inner);
        },
        c.max_threads);
    parallel_for(
        outer * splits, 1,
        [&](i64 b, i64 e) {
          T* __restrict sum = reinterpret_cast<T*>(c.thread_scratch());
          for (i64 u = b; u < e; ++u) {
            const T* first = parts + u / splits * splits * inner;
            std::copy(first, first + inner, sum);
            for (i64 p = 1; p < splits; ++p)
              for (i64 j = 0; j < inner; ++j) sum[j] += first[p * inner + j];
            rows(u, sum);
          }
        },
        c.max_threads);
  }

 private:
  void row(const T* yr, const T* dr, T* xr) const {
    T acc[kLanes] = {};
    i64 j = 0;
    for (; j + kLanes <= n; j += kLanes)
      for (int l = 0; l < kLanes; ++l) acc[l] += dr[j + l] * yr[j + l];
    T s = 0;
    for (; j < n; ++j) s += dr[j] * yr[j];
    for (T a : acc) s += a;
    for (j = 0; j < n; ++j) xr[j] = yr[j] * (dr[j] - s);
  }
};

// dx = r (g - mean(g) - xhat mean(g xhat)) per row of n, with xhat = (x -
// mean) r, r = 1 / sqrt(var + eps) and g = dy gamma; rms_norm has no mean
// terms. Three passes over a row that stays in cache: the mean, then the
// variance and the two sums together, then dx.
template <class T>
class NormBackwardKernel final : public CpuKernel {
 public:
  compile::BufferId x = 0, dy = 0, dx = 0;
  std::optional<compile::BufferId> gamma;
  i64 rows = 1, n = 1;
  double eps = 0;  // the node's, default filled in from the op table
  bool rms = false;

  void run(const RunCtx& c) const override {
    const T *xp = at<T>(c, x), *dp = at<T>(c, dy);
    const T* gp = gamma ? at<T>(c, *gamma) : nullptr;
    T* op = at_mut<T>(c, dx);
    parallel_for(
        rows, std::max<i64>(1, kGrain / std::max<i64>(n, 1)),
        [&](i64 b, i64 e) {
          for (i64 r = b; r < e; ++r) row(xp + r * n, dp + r * n, gp, op + r * n);
        },
        c.max_threads);
  }

 private:
  T g_at(const T* dr, const T* gp, i64 j) const { return gp ? dr[j] * gp[j] : dr[j]; }

  void row(const T* xr, const T* dr, const T* gp, T* out) const {
    T mu = 0;
    if (!rms) {
      T acc[kLanes] = {};
      i64 j = 0;
      for (; j + kLanes <= n; j += kLanes)
        for (int l = 0; l < kLanes; ++l) acc[l] += xr[j + l];
      double s = 0;
      for (; j < n; ++j) s += double(xr[j]);
      for (T a : acc) s += double(a);
      mu = T(s / double(n));
    }
    T var[kLanes] = {}, sg[kLanes] = {}, sgx[kLanes] = {};
    i64 j = 0;
    for (; j + kLanes <= n; j += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const T d = xr[j + l] - mu, g = g_at(dr, gp, j + l);
        var[l] += d * d;
        sg[l] += g;
        sgx[l] += g * d;
      }
    double v = 0, sum_g = 0, sum_gx = 0;
    for (; j < n; ++j) {
      const double d = double(xr[j] - mu), g = double(g_at(dr, gp, j));
      v += d * d, sum_g += g, sum_gx += g * d;
    }
    for (int l = 0; l < kLanes; ++l) v += double(var[l]), sum_g += double(sg[l]), sum_gx += double(sgx[l]);
    const double inv = 1 / std::sqrt(v / double(n) + eps);
    // dx = inv g - inv mean(g) - (x - mean) inv^3 mean(g (x - mean)).
    const T a = T(inv), m = T(rms ? 0.0 : sum_g / double(n) * inv), cx = T(sum_gx / double(n) * inv * inv * inv);
    for (j = 0; j < n; ++j) out[j] = a * g_at(dr, gp, j) - m - (xr[j] - mu) * cx;
  }
};

template <class T>
std::unique_ptr<CpuKernel> make_softmax_backward(const BuildCtx& b, const ir::Node& n) {
  const auto& yb = b.in_of(n.inputs.at(0));
  auto k = std::make_unique<SoftmaxBackwardKernel<T>>();
  k->y = yb.id, k->dy = b.in_of(n.inputs.at(1)).id, k->dx = b.out(0).id;
  const std::size_t rank = yb.shape.size();
  if (rank > 0) {
    auto axis = std::size_t(ir::normalize_axis(n.attrs.get_int("axis"), rank));
    for (std::size_t d = 0; d < axis; ++d) k->outer *= yb.shape[d];
    for (std::size_t d = axis + 1; d < rank; ++d) k->inner *= yb.shape[d];
    k->n = yb.shape[axis];
  }
  if (k->inner > 1) {
    k->splits = std::clamp<i64>(b.threads / std::max<i64>(k->outer, 1), 1, std::max<i64>(k->n, 1));
    k->thread_bytes = std::size_t(k->inner) * sizeof(T);
    if (k->splits > 1) k->shared_bytes = std::size_t(k->outer * k->splits * k->inner) * sizeof(T);
  }
  return k;
}

template <class T>
std::unique_ptr<CpuKernel> make_norm_backward(const BuildCtx& b, const ir::Node& n) {
  const auto& xb = b.in_of(n.inputs.at(0));
  auto k = std::make_unique<NormBackwardKernel<T>>();
  k->x = xb.id, k->dy = b.in_of(n.inputs.at(1)).id, k->dx = b.out(0).id;
  k->rms = n.op == OpKind::RmsNormBackward;
  k->eps = n.attrs.get_float("eps");
  const std::size_t rank = xb.shape.size();
  std::size_t axis = rank ? rank - 1 : 0;
  if (!k->rms && rank) axis = std::size_t(ir::normalize_axis(n.attrs.get_int("axis"), rank));
  for (std::size_t d = 0; d < rank; ++d) (d < axis ? k->rows : k->n) *= xb.shape[d];
  if (n.inputs.size() > 2) k->gamma = b.in_of(n.inputs[2]).id;
  return k;
}

}  // namespace

std::unique_ptr<CpuKernel> build_backward(const BuildCtx& b) {
  const ir::Node& n = b.anchor();
  if (n.dtype != DType::F32 && n.dtype != DType::F64)
    b.fail(std::string(ir::op_name(n.op)) + " runs in f32 or f64; " + std::string(ir::dtype_name(n.dtype)) +
           " must be legalized to f32 first");
  const bool f32 = n.dtype == DType::F32;
  switch (n.op) {
    case OpKind::SoftmaxBackward: return f32 ? make_softmax_backward<float>(b, n) : make_softmax_backward<double>(b, n);
    case OpKind::LayerNormBackward:
    case OpKind::RmsNormBackward: return f32 ? make_norm_backward<float>(b, n) : make_norm_backward<double>(b, n);
    default: b.fail("op " + std::string(ir::op_name(n.op)) + " is not a backward op");
  }
}

}  // namespace rlx::backends::cpu
