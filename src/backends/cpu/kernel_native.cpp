// Native kernels for the composites the CPU backend claims: softmax,
// log_softmax, layer_norm, rms_norm, conv1d/conv2d (im2col + GEMM per tile),
// max/avg pooling, attention (per query block: QK^T, mask, softmax, PV) and rope.
#include <cblas.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "backends/cpu/gemm_pack.hpp"
#include "backends/cpu/isa.hpp"
#include "backends/cpu/kernels.hpp"
#include "rlx/env.hpp"
#include "rlx/error.hpp"

namespace rlx::backends::cpu {

namespace {

using ir::DType;
using ir::OpKind;

template <class T>
void gemm(bool tb, i64 m, i64 n, i64 k, T alpha, const T* a, i64 lda, const T* b, i64 ldb, T* c, i64 ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (i64 i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, T(0));
    return;
  }
  const auto tr = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, tr, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), 0.0f, c,
                int(ldc));
  else
    cblas_dgemm(CblasRowMajor, CblasNoTrans, tr, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), 0.0, c,
                int(ldc));
}

// Softmax over n elements `stride` apart, exactly the reference's formula (f64).
void softmax_strided(const double* x, double* y, i64 n, i64 stride, bool log) {
  double m = -INFINITY, sum = 0;
  for (i64 k = 0; k < n; ++k) m = std::fmax(m, x[k * stride]);
  for (i64 k = 0; k < n; ++k) sum += std::exp(x[k * stride] - m);
  for (i64 k = 0; k < n; ++k)
    y[k * stride] = log ? x[k * stride] - m - std::log(sum) : std::exp(x[k * stride] - m) / sum;
}

class SoftmaxKernel final : public CpuKernel {
 public:
  compile::BufferId x = 0, y = 0;
  DType dtype = DType::F32;
  i64 outer = 1, n = 1, inner = 1;
  bool log = false;

  void run(const RunCtx& c) const override {
    if (dtype == DType::F32) {
      const float* xp = at<float>(c, x);
      float* yp = at_mut<float>(c, y);
      if (inner == 1) {
        parallel_for(
            outer, std::max<i64>(1, kGrain / std::max<i64>(n, 1)),
            [&](i64 b, i64 e) { c.isa->softmax_rows(xp + b * n, yp + b * n, e - b, n, log); }, c.max_threads);
      } else {
        // Units of up to 256 columns: 1 KiB per row keeps the strided row
        // reads streaming from memory, and the units spread over the threads.
        const i64 width = 256;
        const i64 per = (inner + width - 1) / width;
        parallel_for(
            outer * per, std::max<i64>(1, kGrain / std::max<i64>(n * width, 1)),
            [&](i64 b, i64 e) {
              for (i64 u = b; u < e; ++u) {
                const i64 o = u / per, i0 = u % per * width;
                c.isa->softmax_cols(xp + o * n * inner + i0, yp + o * n * inner + i0, n, inner,
                                    std::min(width, inner - i0), log);
              }
            },
            c.max_threads);
      }
      return;
    }
    const double* xp = at<double>(c, x);
    double* yp = at_mut<double>(c, y);
    parallel_for(
        outer * inner, std::max<i64>(1, kGrain / std::max<i64>(n, 1)),
        [&](i64 b, i64 e) {
          for (i64 u = b; u < e; ++u) {
            i64 o = u / inner, i = u % inner;
            softmax_strided(xp + o * n * inner + i, yp + o * n * inner + i, n, inner, log);
          }
        },
        c.max_threads);
  }
};

class NormKernel final : public CpuKernel {
 public:
  compile::BufferId x = 0, y = 0;
  std::optional<compile::BufferId> gamma, beta;
  DType dtype = DType::F32;
  i64 rows = 1, n = 1;
  double eps = 0;  // the node's, default filled in from the op table
  bool rms = false;

  void run(const RunCtx& c) const override {
    const i64 grain = std::max<i64>(1, kGrain / std::max<i64>(n, 1));
    if (dtype == DType::F32) {
      const float* xp = at<float>(c, x);
      float* yp = at_mut<float>(c, y);
      const float* g = gamma ? at<float>(c, *gamma) : nullptr;
      const float* be = beta ? at<float>(c, *beta) : nullptr;
      parallel_for(
          rows, grain,
          [&](i64 b, i64 e) { c.isa->norm_rows(xp + b * n, yp + b * n, g, be, e - b, n, float(eps), rms); },
          c.max_threads);
      return;
    }
    const double* xp = at<double>(c, x);
    double* yp = at_mut<double>(c, y);
    const double* g = gamma ? at<double>(c, *gamma) : nullptr;
    const double* be = beta ? at<double>(c, *beta) : nullptr;
    parallel_for(
        rows, grain,
        [&](i64 b, i64 e) {
          for (i64 r = b; r < e; ++r) {
            const double* p = xp + r * n;
            double mean = 0, var = 0;
            if (!rms) {
              for (i64 j = 0; j < n; ++j) mean += p[j];
              mean /= double(n);
            }
            for (i64 j = 0; j < n; ++j) var += (p[j] - mean) * (p[j] - mean);
            double inv = 1 / std::sqrt(var / double(n) + eps);
            for (i64 j = 0; j < n; ++j) {
              double v = (p[j] - mean) * inv;
              if (g) v *= g[j];
              if (be) v += be[j];
              yp[r * n + j] = v;
            }
          }
        },
        c.max_threads);
  }
};

// rope: each row of x's last dim (D = 2 half) rotated pairwise by its row of cos and sin, which broadcast over
// x's leading dims (a stride of 0 there) and may broadcast along the pairs too (inner stride 0).
template <class T>
class RopeKernel final : public CpuKernel {
 public:
  struct Operand {
    compile::BufferId id = 0;
    std::vector<i64> stride;  // per leading dim of x, in elements
    i64 inner = 1;            // along the pairs
  };
  compile::BufferId x = 0, y = 0;
  Operand cos, sin;
  std::vector<i64> lead;  // x's leading extents
  i64 rows = 0, half = 0;
  bool interleaved = true;

  void run(const RunCtx& c) const override {
    const T* xp = at<T>(c, x);
    T* yp = at_mut<T>(c, y);
    const T *cp = at<T>(c, cos.id), *sp = at<T>(c, sin.id);
    const i64 D = 2 * half, a_step = interleaved ? 2 : 1, b_off = interleaved ? 1 : half;
    parallel_for(
        rows, std::max<i64>(1, kGrain / std::max<i64>(D, 1)),
        [&](i64 b, i64 e) {
          for (i64 r = b; r < e; ++r) {
            i64 co = 0, so = 0;
            for (i64 d = i64(lead.size()) - 1, rem = r; d >= 0; --d) {
              const i64 i = rem % lead[std::size_t(d)];
              rem /= lead[std::size_t(d)];
              co += i * cos.stride[std::size_t(d)];
              so += i * sin.stride[std::size_t(d)];
            }
            const T *xr = xp + r * D, *cr = cp + co, *sr = sp + so;
            T* yr = yp + r * D;
            for (i64 i = 0; i < half; ++i) {
              const T x0 = xr[i * a_step], x1 = xr[i * a_step + b_off], cv = cr[i * cos.inner], sv = sr[i * sin.inner];
              yr[i * a_step] = x0 * cv - x1 * sv;
              yr[i * a_step + b_off] = x0 * sv + x1 * cv;
            }
          }
        },
        c.max_threads);
  }
};

template <class T>
std::unique_ptr<CpuKernel> make_rope(const BuildCtx& b, const ir::Node& n) {
  auto k = std::make_unique<RopeKernel<T>>();
  const auto& xb = b.in_of(n.inputs.at(0));
  k->x = xb.id, k->y = b.out(0).id;
  k->interleaved = n.attrs.get_bool("interleaved");
  k->lead.assign(xb.shape.begin(), xb.shape.end() - 1);
  k->half = xb.shape.back() / 2;
  k->rows = numel(k->lead);
  for (auto [op, in] : {std::pair{&k->cos, n.inputs.at(1)}, std::pair{&k->sin, n.inputs.at(2)}}) {
    const auto& ob = b.in_of(in);
    op->id = ob.id;
    // ob's shape right-aligned to [lead..., half]; unit or missing dims broadcast.
    const auto cs = ir::contiguous_strides(ob.shape);
    const std::size_t rank = ob.shape.size(), full = k->lead.size() + 1;
    op->stride.assign(k->lead.size(), 0);
    for (std::size_t d = 0; d < rank; ++d) {
      const std::size_t at = full - rank + d;
      const i64 st = ob.shape[d] == 1 ? 0 : cs[d];
      if (at + 1 == full)
        op->inner = st;
      else
        op->stride[at] = st;
    }
    if (rank == 0) op->inner = 0;
  }
  return k;
}

// conv1d runs as conv2d with H = 1.
struct ConvShape {
  i64 N = 1, C = 1, H = 1, W = 1, O = 1, KH = 1, KW = 1, OH = 1, OW = 1;
  i64 sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, G = 1;
  i64 Cg() const { return C / G; }
  i64 Og() const { return O / G; }
  i64 CK() const { return Cg() * KH * KW; }
  i64 P() const { return OH * OW; }
  bool pointwise() const { return KH == 1 && KW == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
};

template <class T>
class ConvKernel final : public CpuKernel {
 public:
  compile::BufferId x = 0, w = 0, y = 0;
  std::optional<compile::BufferId> bias;
  ConvShape s;
  i64 tile = 1, tiles = 1;   // output positions per work unit (packed: of all images' positions in a row)
  i64 rows = 1, blocks = 1;  // output channels per work unit
  // f32 with a SIMD ISA: the packed-B GEMM (isa/gemm_impl.inc) with the
  // weights read in place as A and tile = gemm_nr, so im2col writes one panel
  // in the layout the GEMM reads; otherwise BLAS.
  bool packed = false;
  // f32 with whole channel blocks on a SIMD ISA: the direct kernel (isa/conv_impl.inc) over a blocked copy of
  // the input in the shared scratch, with the weights packed once (wpacked: their pointer-table index) or, when
  // they are not constant, per run after the input.
  bool direct = false;
  ConvGeom geom;
  std::int32_t wpacked = -1;
  i64 xb_floats = 0;
  // Winograd F(2x2, 3x3) (isa/conv_impl.inc) with the weights' transforms packed once (wpacked): the blocked
  // input, the transformed input and the 16 GEMMs' products follow each other in the shared scratch.
  bool winograd = false;
  i64 v_floats = 0;

  // A unit is one GEMM, y[rows of a channel block, tile of positions] =
  // w[block, CK] x col[CK, tile], after im2col of its tile.
  void run(const RunCtx& c) const override {
    const T* xp = at<T>(c, x);
    const T* wp = at<T>(c, w);
    T* yp = at_mut<T>(c, y);
    const T* bp = bias ? at<T>(c, *bias) : nullptr;
    if (winograd) {
      if constexpr (std::is_same_v<T, float>) run_winograd(c, xp, yp, bp);
      return;
    }
    if (direct) {
      if constexpr (std::is_same_v<T, float>) run_direct(c, xp, wp, yp, bp);
      return;
    }
    if (packed) {
      if constexpr (std::is_same_v<T, float>) run_packed(c, xp, wp, yp, bp);
      return;
    }
    const i64 P = s.P(), Cg = s.Cg(), Og = s.Og(), CK = s.CK();
    parallel_for(
        s.N * s.G * tiles * blocks, 1,
        [&](i64 b, i64 e) {
          T* col = reinterpret_cast<T*>(c.thread_scratch());
          for (i64 u = b; u < e; ++u) {
            const i64 ng = u / (tiles * blocks), n = ng / s.G, g = ng % s.G;
            const i64 t = u / blocks % tiles, o0 = u % blocks * rows, o1 = std::min(Og, o0 + rows);
            const i64 p0 = t * tile, p1 = std::min(P, p0 + tile), cols = p1 - p0;
            const T* xg = xp + (n * s.C + g * Cg) * s.H * s.W;
            const T* wg = wp + g * Og * CK;            // the group's weights
            T* yg = yp + (n * s.O + g * Og) * P + p0;  // its channel 0 at position p0
            if (s.pointwise()) {
              gemm<T>(false, o1 - o0, cols, Cg, T(1), wg + o0 * CK, CK, xg + p0, s.H * s.W, yg + o0 * P, P);
            } else {
              im2col(xg, col, p0, p1, cols, cols);
              gemm<T>(false, o1 - o0, cols, CK, T(1), wg + o0 * CK, CK, col, cols, yg + o0 * P, P);
            }
            if (bp)
              for (i64 o = o0; o < o1; ++o)
                for (T* q = yg + o * P; q < yg + o * P + cols; ++q) *q += bp[g * Og + o];
          }
        },
        c.max_threads);
  }

 private:
  void run_winograd(const RunCtx& c, const float* xp, float* yp, const float* bp) const {
    const KernelTable& isa = *c.isa;
    const ConvGeom& g = geom;
    auto* xb = reinterpret_cast<float*>(c.shared);
    float* v = xb + xb_floats;
    float* m = v + v_floats;
    const i64 blocks_in = g.N * (g.Cg / g.block);
    parallel_for(
        blocks_in, 1, [&](i64 u0, i64 u1) { isa.conv_block_input(g, xp, xb, u0, u1); }, c.max_threads);
    parallel_for(
        blocks_in, 1, [&](i64 u0, i64 u1) { isa.wino_input(g, xb, v, u0, u1); }, c.max_threads);
    // 16 GEMMs [tiles, Cg] x [Cg, Og], in row blocks; units run GEMM by GEMM so that a thread's next unit
    // reuses the packed weights it just read.
    const i64 wino_tiles = g.N * ((g.OH + 1) / 2) * ((g.OW + 1) / 2), C = g.Cg, O = g.Og, nr = isa.gemm_nr;
    const i64 panels = (O + nr - 1) / nr, rows = 96, row_blocks = (wino_tiles + rows - 1) / rows;
    const auto* u = reinterpret_cast<const float*>(c.ptrs[wpacked]);
    const i64 each = i64(packed_floats(isa, C, O));
    parallel_for(
        16 * row_blocks, 1,
        [&](i64 u0, i64 u1) {
          for (i64 unit = u0; unit < u1; ++unit) {
            const i64 xi = unit / row_blocks, r0 = unit % row_blocks * rows;
            isa.gemm_packed(v + xi * g.v_stride, C, u + xi * each, nr, C * nr, C, O, m + xi * g.m_stride, O, r0,
                            std::min(wino_tiles, r0 + rows), 0, panels);
          }
        },
        c.max_threads);
    parallel_for(
        g.N * (O / g.block), 1, [&](i64 u0, i64 u1) { isa.wino_output(g, m, bp, yp, u0, u1); }, c.max_threads);
  }

  void run_direct(const RunCtx& c, const float* xp, const float* wp, float* yp, const float* bp) const {
    const KernelTable& isa = *c.isa;
    const ConvGeom& g = geom;
    auto* xb = reinterpret_cast<float*>(c.shared);
    float* wk_run = xb + xb_floats;
    parallel_for(
        g.N * g.G * (g.Cg / g.block), 1, [&](i64 u0, i64 u1) { isa.conv_block_input(g, xp, xb, u0, u1); },
        c.max_threads);

    if (wpacked < 0)
      parallel_for(
          g.G * (g.Og / g.block), 1,
          [&](i64 u0, i64 u1) { isa.conv_pack_weights(wp, g.G, g.Og, g.Cg, g.KH * g.KW, wk_run, u0, u1); },
          c.max_threads);
    const float* wk = wpacked >= 0 ? reinterpret_cast<const float*>(c.ptrs[wpacked]) : wk_run;
    parallel_for(
        g.units(), 1, [&](i64 u0, i64 u1) { isa.conv_direct(g, xb, wk, bp, yp, u0, u1); }, c.max_threads);
  }

  // The packed path. Panels of gemm_nr positions run over all images' positions in a row (image n's position
  // p is column n * P + p), so only the batch's last panel is partial: per image, 196 positions in 64-wide
  // panels would leave a quarter of every image's last panel idle. A panel inside one image is stored in
  // place; one that straddles two images is computed into scratch and copied out by image.
  void run_packed(const RunCtx& c, const float* xp, const float* wp, float* yp, const float* bp) const {
    const i64 P = s.P(), Cg = s.Cg(), Og = s.Og(), CK = s.CK(), NP = s.N * P;
    parallel_for(
        s.G * tiles * blocks, 1,
        [&](i64 b, i64 e) {
          float* col = reinterpret_cast<float*>(c.thread_scratch());
          float* out = col + CK * tile;  // [Og, tile]: a straddling panel's product
          for (i64 u = b; u < e; ++u) {
            const i64 g = u / (tiles * blocks), t = u / blocks % tiles;
            const i64 o0 = u % blocks * rows, o1 = std::min(Og, o0 + rows);
            const i64 q0 = t * tile, q1 = std::min(NP, q0 + tile), cols = q1 - q0;
            const i64 n0 = q0 / P, n1 = (q1 - 1) / P;
            const float* wg = wp + g * Og * CK;
            // Image n's positions [pa, pb) of this panel start at panel column n * P + pa - q0.
            auto segment = [&](i64 n) {
              const i64 pa = std::max(q0, n * P) - n * P, pb = std::min(q1, (n + 1) * P) - n * P;
              return std::array<i64, 3>{pa, pb, n * P + pa - q0};
            };
            for (i64 n = n0; n <= n1; ++n) {
              const auto [pa, pb, c0] = segment(n);
              im2col(xp + (n * s.C + g * Cg) * s.H * s.W, col + c0, pa, pb, tile, tile - c0);
            }
            if (n0 == n1) {
              float* yg = yp + (n0 * s.O + g * Og) * P + (q0 - n0 * P);
              c.isa->gemm_packed(wg, CK, col, tile, CK * tile, CK, cols, yg, P, o0, o1, 0, 1);
              if (bp)
                for (i64 o = o0; o < o1; ++o)
                  for (float* q = yg + o * P; q < yg + o * P + cols; ++q) *q += bp[g * Og + o];
              continue;
            }
            c.isa->gemm_packed(wg, CK, col, tile, CK * tile, CK, cols, out, tile, o0, o1, 0, 1);
            for (i64 n = n0; n <= n1; ++n) {
              const auto [pa, pb, c0] = segment(n);
              for (i64 o = o0; o < o1; ++o) {
                const float* src = out + o * tile + c0;
                float* dst = yp + (n * s.O + g * Og + o) * P + pa;
                const float add = bp ? bp[g * Og + o] : 0.0f;
                for (i64 j = 0; j < pb - pa; ++j) dst[j] = src[j] + add;
              }
            }
          }
        },
        c.max_threads);
  }

  // col[(c, kh, kw), p - p0] = x[c, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw] (0 outside).
  // Per output row, the columns that read inside the image are one strided
  // run between two runs of zeros. When output rows are input rows shifted
  // (stride 1, OW == W: "same" padding), the runs of all rows are one copy,
  // after which the columns outside the image are zeroed.
  // Rows are `ld` floats apart; columns [p1 - p0, width) of each row are zeroed (width <= ld; the packed
  // path writes a panel's images one after another, each at its own column).
  void im2col(const T* x, T* col, i64 p0, i64 p1, i64 ld, i64 width) const {
    const i64 cols = p1 - p0;
    const bool shifted = s.sh == 1 && s.sw == 1 && s.OW == s.W;
    auto ceil_div = [](i64 a, i64 b) { return a >= 0 ? (a + b - 1) / b : -(-a / b); };
    // A packed panel (at most kMaskCols positions) of a shifted conv: which of its columns each kernel column
    // keeps is the same for every channel and kernel row, so it is worked out once here, and each row becomes
    // one select over a contiguous read instead of a copy, two fills and a zeroing loop per output row (those
    // per-row costs were about a third of a 3x3 conv's time).
    constexpr i64 kMaskCols = 64, kMaskKw = 16;
    const bool masked = shifted && cols <= kMaskCols && s.KW <= kMaskKw;
    std::array<std::array<unsigned char, kMaskCols>, kMaskKw> keep{};
    if (masked)
      for (i64 kw = 0; kw < s.KW; ++kw) {
        const i64 off = kw * s.dw - s.pw;
        const i64 lo = std::clamp<i64>(-off, 0, s.OW), hi = std::clamp<i64>(s.W - off, lo, s.OW);
        for (i64 j = 0; j < cols; ++j) {
          const i64 ow = (p0 + j) % s.OW;
          keep[std::size_t(kw)][std::size_t(j)] = ow >= lo && ow < hi;
        }
      }
    for (i64 ch = 0; ch < s.Cg(); ++ch)
      for (i64 kh = 0; kh < s.KH; ++kh)
        for (i64 kw = 0; kw < s.KW; ++kw) {
          T* row = col + ((ch * s.KH + kh) * s.KW + kw) * ld;
          std::fill(row + cols, row + width, T(0));
          const T* xc = x + ch * s.H * s.W;
          const i64 off = kw * s.dw - s.pw;  // input column of output column ow: ow * sw + off
          const i64 lo = std::clamp<i64>(ceil_div(-off, s.sw), 0, s.OW);
          const i64 hi = std::clamp<i64>(ceil_div(s.W - off, s.sw), lo, s.OW);
          if (shifted) {
            // Positions [q0, q1) read input rows inside the image, from x[p + shift].
            const i64 dh = kh * s.dh - s.ph, shift = dh * s.W + off;
            const i64 q0 = std::clamp(-dh * s.OW, p0, p1), q1 = std::clamp((s.H - dh) * s.OW, q0, p1);
            const i64 c0 = std::clamp(-shift, q0, q1), c1 = std::clamp(s.H * s.W - shift, c0, q1);
            if (masked) {
              const unsigned char* k = keep[std::size_t(kw)].data();
              const T* src = xc + (c0 + shift);  // column c0 - p0's input: reads stay inside the channel
              std::fill(row, row + (c0 - p0), T(0));
              for (i64 j = 0; j < c1 - c0; ++j) row[c0 - p0 + j] = k[c0 - p0 + j] ? src[j] : T(0);
              std::fill(row + (c1 - p0), row + cols, T(0));
              continue;
            }
            std::fill(row, row + (c0 - p0), T(0));
            std::copy(xc + (c0 + shift), xc + (c1 + shift), row + (c0 - p0));
            std::fill(row + (c1 - p0), row + cols, T(0));
            for (i64 r = q0 / s.OW * s.OW; r < q1; r += s.OW)
              for (auto [z0, z1] : {std::pair{r, r + lo}, std::pair{r + hi, r + s.OW}})
                for (i64 p = std::max(z0, q0); p < std::min(z1, q1); ++p) row[p - p0] = T(0);
            continue;
          }
          for (i64 p = p0; p < p1;) {
            const i64 oh = p / s.OW, ow0 = p % s.OW, ow1 = std::min(s.OW, ow0 + (p1 - p));
            const i64 ih = oh * s.sh - s.ph + kh * s.dh;
            T* out = row + (p - p0);  // output column ow goes to out[ow - ow0]
            const bool inside = ih >= 0 && ih < s.H;
            const i64 a = inside ? std::clamp(lo, ow0, ow1) : ow1, b = std::clamp(hi, a, ow1);
            std::fill(out, out + (a - ow0), T(0));
            if (a < b) {
              const T* xr = xc + ih * s.W;
              if (s.sw == 1)
                std::copy(xr + (a + off), xr + (b + off), out + (a - ow0));
              else
                for (i64 ow = a; ow < b; ++ow) out[ow - ow0] = xr[ow * s.sw + off];
            }
            std::fill(out + (b - ow0), out + (ow1 - ow0), T(0));
            p += ow1 - ow0;
          }
        }
  }
};

template <class T>
class PoolKernel final : public CpuKernel {
 public:
  compile::BufferId x = 0, y = 0;
  bool is_max = true;
  i64 planes = 1, H = 1, W = 1, OH = 1, OW = 1, kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;

  void run(const RunCtx& c) const override {
    const T* xp = at<T>(c, x);
    T* yp = at_mut<T>(c, y);
    const double inv = 1.0 / double(kh * kw);
    parallel_for(
        planes * OH, std::max<i64>(1, kGrain / std::max<i64>(OW * kh * kw, 1)),
        [&](i64 b, i64 e) {
          for (i64 u = b; u < e; ++u) {
            const i64 p = u / OH, oh = u % OH;
            const T* xpl = xp + p * H * W;
            T* out = yp + (p * OH + oh) * OW;
            const i64 h0 = oh * sh - ph, hs = std::max<i64>(h0, 0), he = std::min(h0 + kh, H);
            for (i64 ow = 0; ow < OW; ++ow) {
              const i64 w0 = ow * sw - pw, ws = std::max<i64>(w0, 0), we = std::min(w0 + kw, W);
              if (is_max) {
                T acc = -std::numeric_limits<T>::infinity();
                for (i64 h = hs; h < he; ++h)
                  for (i64 w = ws; w < we; ++w) {
                    T v = xpl[h * W + w];
                    acc = std::isnan(v) || std::isnan(acc) ? std::numeric_limits<T>::quiet_NaN() : std::max(acc, v);
                  }
                out[ow] = acc;
              } else {
                double acc = 0;  // counts padding as zeros: divide by the full window
                for (i64 h = hs; h < he; ++h)
                  for (i64 w = ws; w < we; ++w) acc += double(xpl[h * W + w]);
                out[ow] = T(acc * inv);
              }
            }
          }
        },
        c.max_threads);
  }
};

template <class T>
class AttentionKernel final : public CpuKernel {
 public:
  compile::BufferId q = 0, k = 0, v = 0, y = 0;
  std::optional<compile::BufferId> mask;
  bool bool_mask = false, causal = false;
  i64 B = 1, H = 1, Hkv = 1, Sq = 1, Sk = 1, D = 1, Dv = 1, qb = 1;
  i64 ms[4] = {0, 0, 0, 0};  // mask element strides over [B, H, Sq, Sk]
  // Element strides of q's, k's, v's and the output's batch, head and position dims (the head dim's is 1): a
  // [B, S, H, D] projection is read, and the result written, as [B, H, S, D] (compile::attention_views).
  i64 qs[3] = {0, 0, 0}, ks[3] = {0, 0, 0}, vs[3] = {0, 0, 0}, os[3] = {0, 0, 0};
  double scale = 1;

  void run(const RunCtx& c) const override {
    const T *qp = at<T>(c, q), *kp = at<T>(c, k), *vp = at<T>(c, v);
    T* yp = at_mut<T>(c, y);
    const std::byte* mp = mask ? c.ptrs[*mask] : nullptr;
    const i64 blocks = (Sq + qb - 1) / qb;
    parallel_for(
        B * H * blocks, 1,
        [&](i64 b0, i64 e0) {
          T* sc = reinterpret_cast<T*>(c.thread_scratch());
          for (i64 u = b0; u < e0; ++u) {
            const i64 bh = u / blocks, bi = bh / H, hi = bh % H, i0 = (u % blocks) * qb, i1 = std::min(Sq, i0 + qb);
            const i64 rows = i1 - i0, kvh = hi / (H / Hkv);
            i64 cols = causal ? std::min(Sk, i1) : Sk;
            // Keys past the last one a bool mask keeps for any of these rows are never read: a KV cache's
            // unwritten tail costs nothing (a fully masked block keeps one column, which gives torch's NaN).
            if (mp && bool_mask) {
              i64 used = 1;
              for (i64 i = i0; i < i1; ++i) {
                const i64 base = bi * ms[0] + hi * ms[1] + i * ms[2];
                for (i64 j = cols; j > used; --j)
                  if (mp[base + (j - 1) * ms[3]] != std::byte{0}) {
                    used = j;
                    break;
                  }
              }
              cols = std::min(cols, used);
            }
            const T* Q = qp + bi * qs[0] + hi * qs[1] + i0 * qs[2];
            const T* K = kp + bi * ks[0] + kvh * ks[1];
            const T* V = vp + bi * vs[0] + kvh * vs[1];
            T* O = yp + bi * os[0] + hi * os[1] + i0 * os[2];
            // f32: the ISA's GEMM over K^T packed per unit (BLAS's small-M path costs ~20x a decode step's
            // work); f64: BLAS.
            [[maybe_unused]] T* packed = sc + (qb * Sk + 15) / 16 * 16;  // 64-byte aligned
            [[maybe_unused]] const KernelTable* isa = c.isa;
            if constexpr (std::is_same_v<T, float>) {
              const i64 panels = (cols + isa->gemm_nr - 1) / isa->gemm_nr;
              isa->gemm_pack_bt(K, ks[2], D, cols, packed, 0, panels);
              isa->gemm_packed(Q, qs[2], packed, isa->gemm_nr, D * isa->gemm_nr, D, cols, sc, cols, 0, rows, 0, panels);
            } else {
              gemm<T>(true, rows, cols, D, T(1), Q, qs[2], K, ks[2], sc, cols);
            }
            for (i64 r = 0; r < rows; ++r) {
              T* s = sc + r * cols;
              for (i64 j = 0; j < cols; ++j) s[j] *= T(scale);
              const i64 i = i0 + r;
              if (mp) {
                const i64 base = bi * ms[0] + hi * ms[1] + i * ms[2];
                if (bool_mask) {
                  for (i64 j = 0; j < cols; ++j)
                    if (mp[base + j * ms[3]] == std::byte{0}) s[j] = -std::numeric_limits<T>::infinity();
                } else {
                  const T* m = reinterpret_cast<const T*>(mp);
                  for (i64 j = 0; j < cols; ++j) s[j] += m[base + j * ms[3]];
                }
              }
              if (causal)
                for (i64 j = i + 1; j < cols; ++j) s[j] = -std::numeric_limits<T>::infinity();
              if constexpr (std::is_same_v<T, float>)
                c.isa->softmax_rows(s, s, 1, cols, false);
              else
                softmax_strided(s, s, cols, 1, false);
            }
            if constexpr (std::is_same_v<T, float>) {
              const i64 nr = isa->gemm_nr, panels = (Dv + nr - 1) / nr;
              if (Dv % isa->simd_width == 0) {  // V read in place
                isa->gemm_packed(sc, cols, V, vs[2], nr, cols, Dv, O, os[2], 0, rows, 0, panels);
              } else {
                isa->gemm_pack_b(V, vs[2], cols, Dv, packed, 0, panels);
                isa->gemm_packed(sc, cols, packed, nr, cols * nr, cols, Dv, O, os[2], 0, rows, 0, panels);
              }
            } else {
              gemm<T>(false, rows, Dv, cols, T(1), sc, cols, V, vs[2], O, os[2]);
            }
          }
        },
        c.max_threads);
  }
};

// An Ints attribute of `count` entries (one entry is repeated).
std::vector<i64> ints_n(const BuildCtx& b, const ir::Node& n, std::string_view key, std::size_t count) {
  auto v = n.attrs.get_ints(key);
  if (v.size() == 1) v.assign(count, v[0]);
  if (v.size() != count)
    b.fail("attribute '" + std::string(key) + "' needs 1 or " + std::to_string(count) + " entries");
  return v;
}

void require_float(const BuildCtx& b, const ir::Node& n) {
  if (n.dtype != DType::F32 && n.dtype != DType::F64)
    b.fail(std::string(ir::op_name(n.op)) + " runs in f32 or f64; " + std::string(ir::dtype_name(n.dtype)) +
           " must be legalized to f32 first");
}

// RLX_CPU_CONV=direct|gemm forces the f32 convolution's algorithm where both apply (tests, benches).
enum class ConvChoice : std::uint8_t { Auto, Direct, Winograd, Gemm };
ConvChoice conv_override() {
  auto value = env::get("RLX_CPU_CONV");
  if (!value) return ConvChoice::Auto;
  if (*value == "direct") return ConvChoice::Direct;
  if (*value == "winograd") return ConvChoice::Winograd;
  if (*value == "gemm") return ConvChoice::Gemm;
  throw Error("RLX_CPU_CONV='" + *value + "' is not one of direct, winograd, gemm");
}

// Why the direct kernel cannot run this f32 conv; empty when it can. It takes whole channel blocks in and out
// of every group, and column strides of 1 or 2 (its register tiles are instantiated for those).
std::string direct_conv_misfit(const KernelTable& isa, const ConvShape& s) {
  const i64 B = isa.conv_block;
  if (B == 0) return std::string("the ") + isa.name + " ISA has no direct convolution";
  if (s.Cg() % B != 0 || s.Og() % B != 0)
    return "channels per group in " + std::to_string(s.Cg()) + " and out " + std::to_string(s.Og()) +
           " are not multiples of " + std::to_string(B);
  if (s.sw > 2) return "column stride " + std::to_string(s.sw) + " is above 2";
  return {};
}

bool constant_buffer(const BuildCtx& b, const compile::Buffer& buf) {
  const auto& root = b.lir.buffer(buf.root < 0 ? buf.id : buf.root);
  return root.role == compile::BufferRole::Param || root.role == compile::BufferRole::Constant;
}

// Why Winograd F(2x2, 3x3) cannot run this f32 conv; empty when it can: the direct kernel's blocks, a 3x3
// stride-1 undilated kernel, one group, and weights that are params or constants (their transforms are
// packed once).
std::string winograd_misfit(const BuildCtx& b, const KernelTable& isa, const ConvShape& s, const compile::Buffer& wb) {
  if (auto why = direct_conv_misfit(isa, s); !why.empty()) return why;
  if (s.KH != 3 || s.KW != 3 || s.sh != 1 || s.sw != 1 || s.dh != 1 || s.dw != 1)
    return "the kernel is not 3x3 with stride 1 and no dilation";
  if (s.G != 1) return "groups " + std::to_string(s.G) + " (one only)";
  if (!constant_buffer(b, wb) || !b.packs) return "the weights are not a param or constant";
  return {};
}

// Where Winograd beats the direct kernel: enough channels and tiles for its 16 GEMMs to run near peak while
// its transforms, which stream the transformed input and the products through memory, stay a small part.
// Measured on the 2-core AVX-512 Xeon, batch 1, C in = C out, 3x3 pad 1, Winograd / direct time:
//   C \ HxW   56x56   28x28   14x14   7x7
//   32         1.6     1.45
//   64         1.2     1.15    1.1
//   128                0.87    0.87    0.93 (16 tiles)
//   256                        0.81    0.98 (16 tiles)
//   512                                1.01 (16 tiles)
bool winograd_wins(const ConvShape& s) {
  const i64 tiles = s.N * ((s.OH + 1) / 2) * ((s.OW + 1) / 2);
  return s.C >= 128 && s.O >= 128 && tiles >= 32;
}

void plan_winograd(const BuildCtx& b, const KernelTable& isa, const compile::Buffer& wb, ConvKernel<float>& k) {
  const ConvShape& s = k.s;
  ConvGeom& g = k.geom;
  g.N = s.N, g.G = 1, g.Cg = s.C, g.Og = s.O, g.KH = 3, g.KW = 3, g.ph = s.ph, g.pw = s.pw;
  g.H = s.H, g.Wd = s.W, g.OH = s.OH, g.OW = s.OW;
  const i64 TH = (s.OH + 1) / 2, TW = (s.OW + 1) / 2, T = s.N * TH * TW;
  g.Hp = std::max(g.H + 2 * g.ph, 2 * TH + 2), g.Wp = std::max(g.Wd + 2 * g.pw, 2 * TW + 2);
  g.block = isa.conv_block;
  k.winograd = true;
  k.xb_floats = g.N * g.Cg * g.Hp * g.Wp;
  // The 16 matrices' starts 64 bytes past a multiple of 4 KiB from one another: at a multiple of 4 KiB the
  // transforms' 16 streams would share L1 sets (measured: the input transform 3.5x slower at 8 x 256 x 14 x 14).
  auto spread = [](i64 floats) { return (floats + 1023) / 1024 * 1024 + 16; };
  g.v_stride = spread(T * g.Cg), g.m_stride = spread(T * g.Og);
  k.v_floats = 16 * g.v_stride;
  const std::size_t u_bytes = 16 * packed_floats(isa, g.Cg, g.Og) * sizeof(float);
  k.wpacked = b.packs->request(wb.id, g.Cg * 9, g.Og, false, {PackFormat::Winograd, false, u_bytes, 1, 9});
  k.shared_bytes = std::size_t(k.xb_floats + k.v_floats + 16 * g.m_stride) * sizeof(float);
}

void plan_direct(const BuildCtx& b, const KernelTable& isa, const compile::Buffer& wb, ConvKernel<float>& k) {
  const ConvShape& s = k.s;
  ConvGeom& g = k.geom;
  g.N = s.N, g.G = s.G, g.Cg = s.Cg(), g.Og = s.Og();
  g.KH = s.KH, g.KW = s.KW, g.sh = s.sh, g.sw = s.sw, g.ph = s.ph, g.pw = s.pw, g.dh = s.dh, g.dw = s.dw;
  if (s.pointwise()) {  // one row of every position: tiles of 14 whatever the image's width
    g.H = 1, g.Wd = s.H * s.W, g.OH = 1, g.OW = s.OH * s.OW;
  } else {
    g.H = s.H, g.Wd = s.W, g.OH = s.OH, g.OW = s.OW;
  }
  g.Hp = g.H + 2 * g.ph, g.Wp = g.Wd + 2 * g.pw;
  g.block = isa.conv_block;
  // Four channel blocks a tile only when a row is too short to fill a tile of two (4 x 7 positions for 2 x 14
  // measured 15% slower on 14 x 14 rows).
  const i64 obs = g.Og / g.block, acc = isa.conv_accumulators;
  g.nb = obs % 4 == 0 && g.OW <= acc / 4 ? 4 : obs % 2 == 0 ? 2 : 1;
  const i64 max_p = std::min<i64>(acc / g.nb, 14);
  g.strips = (g.OW + max_p - 1) / max_p;
  k.direct = true;
  k.xb_floats = g.N * g.G * g.Cg * g.Hp * g.Wp;
  const i64 taps = g.KH * g.KW, w_floats = g.G * g.Og * g.Cg * taps;
  if (constant_buffer(b, wb) && b.packs)
    k.wpacked = b.packs->request(wb.id, g.Cg * taps, g.G * g.Og, false,
                                 {PackFormat::Conv, false, std::size_t(w_floats) * sizeof(float), g.G, taps});
  k.shared_bytes = std::size_t(k.xb_floats + (k.wpacked < 0 ? w_floats : 0)) * sizeof(float);
}

template <class T>
std::unique_ptr<CpuKernel> make_conv(const BuildCtx& b, const ir::Node& n) {
  const auto& xb = b.in_of(n.inputs.at(0));
  const auto& wb = b.in_of(n.inputs.at(1));
  const auto& yb = b.out(0);
  const bool two = n.op == OpKind::Conv2d;
  const std::size_t sp = two ? 2 : 1;
  auto stride = ints_n(b, n, "stride", sp), pad = ints_n(b, n, "padding", sp), dil = ints_n(b, n, "dilation", sp);
  auto k = std::make_unique<ConvKernel<T>>();
  ConvShape& s = k->s;
  s.N = xb.shape[0];
  s.C = xb.shape[1];
  s.O = wb.shape[0];
  s.G = n.attrs.get_int("groups");
  if (two) {
    s.H = xb.shape[2], s.W = xb.shape[3], s.KH = wb.shape[2], s.KW = wb.shape[3];
    s.OH = yb.shape[2], s.OW = yb.shape[3];
    s.sh = stride[0], s.sw = stride[1], s.ph = pad[0], s.pw = pad[1], s.dh = dil[0], s.dw = dil[1];
  } else {
    s.W = xb.shape[2], s.KW = wb.shape[2], s.OW = yb.shape[2];
    s.sw = stride[0], s.pw = pad[0], s.dw = dil[0];
  }
  if (s.G < 1 || s.C % s.G || s.O % s.G || wb.shape[1] * s.G != s.C) b.fail("conv channels do not match the groups");
  if (!std::is_same_v<T, float> && (conv_override() == ConvChoice::Direct || conv_override() == ConvChoice::Winograd))
    b.fail("RLX_CPU_CONV=" + *env::get("RLX_CPU_CONV") + ": it runs in f32 only");
  k->x = xb.id;
  k->w = wb.id;
  k->y = yb.id;
  if (n.inputs.size() > 2) k->bias = b.in_of(n.inputs[2]).id;
  if constexpr (std::is_same_v<T, float>) {
    const KernelTable& isa = b.packs && b.packs->isa ? *b.packs->isa : select_kernels();
    const ConvChoice choice = conv_override();
    const std::string wino_misfit = winograd_misfit(b, isa, s, wb);
    if (choice == ConvChoice::Winograd && !wino_misfit.empty()) b.fail("RLX_CPU_CONV=winograd: " + wino_misfit);
    if (wino_misfit.empty() && (choice == ConvChoice::Winograd || (choice == ConvChoice::Auto && winograd_wins(s)))) {
      plan_winograd(b, isa, wb, *k);
      return k;
    }
    const std::string misfit = direct_conv_misfit(isa, s);
    if (choice == ConvChoice::Direct && !misfit.empty()) b.fail("RLX_CPU_CONV=direct: " + misfit);
    if (misfit.empty() && choice != ConvChoice::Gemm) {
      plan_direct(b, isa, wb, *k);
      return k;
    }
    if (std::string_view(isa.name) != "generic") {
      // One panel of positions a unit, all output channels (the weights are read in place, so a unit
      // costs its im2col panel); with fewer units than threads, channel blocks of at least 48 rows.
      const i64 P = std::max<i64>(s.P(), 1), Og = std::max<i64>(s.Og(), 1), nr = isa.gemm_nr;
      k->packed = true;
      k->tile = nr;
      k->tiles = (s.N * P + nr - 1) / nr;  // panels run over every image's positions (run_packed)
      // Fewer units than threads: channel blocks of at least 48 rows. Fewer than 4 units a thread: channel
      // blocks of at least 256 rows too, so that the threads share a batch's last, partial panel (a 196-position
      // image is 64 + 64 + 64 + 4 columns: by panels alone one of two threads gets 128 and the other 68). Each
      // block rebuilds its panel's im2col, which only blocks of 256 rows or more amortize (measured: 1x1
      // 256->1024 on 196 positions 0.81x -> 1.01x ONNX Runtime; 3x3 256->256 slower with 128-row blocks).
      const i64 units = std::max<i64>(s.G, 1) * k->tiles, threads = std::max<i64>(b.threads, 1);
      const i64 split = std::max<i64>(1, (threads + units - 1) / units),
                balance = std::max<i64>(1, (4 * threads + units - 1) / units);
      k->rows =
          std::min({Og, std::max<i64>(48, (Og + split - 1) / split), std::max<i64>(256, (Og + balance - 1) / balance)});
      k->blocks = (Og + k->rows - 1) / k->rows;
      k->thread_bytes = std::size_t((std::max<i64>(s.CK(), 1) + Og) * nr) * sizeof(float);
      return k;
    }
  }
  // Each GEMM call repacks its share of the weights, so units are as large as
  // possible: a whole image's positions (the im2col tile capped at 4 MiB)
  // and all output channels. With fewer units than threads, the smaller
  // operand is split: output channels when the weights (Og x CK) outweigh
  // the im2col tile (CK x tile), which each such unit rebuilds; else positions.
  const i64 P = std::max<i64>(s.P(), 1), CK = std::max<i64>(s.CK(), 1), Og = std::max<i64>(s.Og(), 1);
  auto round16 = [&](i64 v) { return std::min(P, (v + 15) / 16 * 16); };
  i64 tile = round16(std::max<i64>(16, i64(4 << 20) / i64(sizeof(T)) / CK));
  i64 rows = Og;
  const i64 units = std::max<i64>(s.N * s.G, 1) * ((P + tile - 1) / tile);
  if (units < b.threads) {
    const i64 split = (b.threads + units - 1) / units;
    if (Og >= tile)
      rows = std::max<i64>(16, ((Og + split - 1) / split + 15) / 16 * 16);
    else
      tile = round16(std::max<i64>(16, (tile + split - 1) / split));
  }
  k->tile = tile;
  k->tiles = (P + tile - 1) / tile;
  k->rows = std::min(rows, Og);
  k->blocks = (Og + k->rows - 1) / k->rows;
  k->thread_bytes = s.pointwise() ? 0 : std::size_t(CK * tile) * sizeof(T);
  return k;
}

template <class T>
std::unique_ptr<CpuKernel> make_pool(const BuildCtx& b, const ir::Node& n) {
  const auto& xb = b.in_of(n.inputs.at(0));
  const auto& yb = b.out(0);
  if (xb.shape.size() < 2) b.fail("pooling needs rank >= 2");
  auto kernel = ints_n(b, n, "kernel", 2), stride = ints_n(b, n, "stride", 2), pad = ints_n(b, n, "padding", 2);
  auto k = std::make_unique<PoolKernel<T>>();
  const std::size_t r = xb.shape.size();
  k->x = xb.id;
  k->y = yb.id;
  k->is_max = n.op == OpKind::MaxPool2d;
  k->H = xb.shape[r - 2], k->W = xb.shape[r - 1], k->OH = yb.shape[r - 2], k->OW = yb.shape[r - 1];
  k->planes = numel(xb.shape) / std::max<i64>(k->H * k->W, 1);
  if (k->H * k->W == 0) k->planes = numel(yb.shape) / std::max<i64>(k->OH * k->OW, 1);
  k->kh = kernel[0], k->kw = kernel[1], k->sh = stride[0], k->sw = stride[1], k->ph = pad[0], k->pw = pad[1];
  return k;
}

template <class T>
std::unique_ptr<CpuKernel> make_attention(const BuildCtx& b, const ir::Node& n) {
  compile::AttentionViews views;
  std::string why;
  if (!compile::attention_views(b.lir, b.kernel, &views, &why)) b.fail("attention: " + why);
  const auto &qb = views.q.shape, &kb = views.k.shape, &vb = views.v.shape;
  if (qb.size() != 4 || kb.size() != 4 || vb.size() != 4 || views.out.shape.size() != 4)
    b.fail("attention needs q, k, v [B, H, S, D]");
  auto k = std::make_unique<AttentionKernel<T>>();
  k->q = views.q.buffer, k->k = views.k.buffer, k->v = views.v.buffer, k->y = views.out.buffer;
  for (int d = 0; d < 3; ++d) {
    k->qs[d] = views.q.strides[d], k->ks[d] = views.k.strides[d];
    k->vs[d] = views.v.strides[d], k->os[d] = views.out.strides[d];
  }
  k->B = qb[0], k->H = qb[1], k->Sq = qb[2], k->D = qb[3];
  k->Sk = kb[2], k->Dv = vb[3];
  k->Hkv = kb[1];
  if (kb[0] != k->B || vb[0] != k->B || vb[1] != k->Hkv || k->Hkv < 1 || k->H % k->Hkv != 0)
    b.fail("attention batch/head dims differ between q, k and v (q's heads must be a multiple of k's)");
  k->causal = n.attrs.bool_or("causal", false);
  k->scale = n.attrs.float_or("scale", 0.0);
  if (k->scale == 0) k->scale = 1 / std::sqrt(double(k->D));
  if (views.mask >= 0) {
    const auto& mb = b.lir.buffer(views.mask);
    k->mask = mb.id;
    k->bool_mask = mb.dtype == DType::Bool;
    if (!k->bool_mask && mb.dtype != n.dtype) b.fail("attention mask must be bool or the query's dtype");
    const std::vector<i64> full{k->B, k->H, k->Sq, k->Sk};
    if (mb.shape.size() > 4) b.fail("attention mask has rank > 4");
    auto cs = ir::contiguous_strides(mb.shape);
    const std::size_t lead = 4 - mb.shape.size();
    for (std::size_t d = 0; d < mb.shape.size(); ++d) {
      if (mb.shape[d] == full[lead + d])
        k->ms[lead + d] = mb.shape[d] == 1 ? 0 : cs[d];
      else if (mb.shape[d] != 1)
        b.fail("attention mask does not broadcast to the scores");
    }
  }
  // Query blocks keep the score tile (qb x Sk) in L2.
  k->qb = std::clamp<i64>(i64(256 * 1024 / sizeof(T)) / std::max<i64>(k->Sk, 1), 8, 256);
  k->qb = std::min(k->qb, std::max<i64>(k->Sq, 1));
  // The score tile, then (f32) the packed K^T or V of one unit.
  k->thread_bytes = std::size_t((k->qb * std::max<i64>(k->Sk, 1) + 15) / 16 * 16) * sizeof(T);
  if constexpr (std::is_same_v<T, float>) {
    const KernelTable& isa = b.packs && b.packs->isa ? *b.packs->isa : select_kernels();
    k->thread_bytes += std::max(packed_floats(isa, k->D, std::max<i64>(k->Sk, 1)),
                                packed_floats(isa, std::max<i64>(k->Sk, 1), k->Dv)) *
                       sizeof(float);
  }
  return k;
}

}  // namespace

std::unique_ptr<CpuKernel> build_native(const BuildCtx& b) {
  const ir::Node& n = b.anchor();
  if (n.op == OpKind::QuantizedMatmul || n.op == OpKind::Embedding || ir::op_info(n.op).cls == ir::OpClass::Quant)
    return build_quant(b);
  if (n.op == OpKind::DynamicUpdateSlice) return build_dynamic_update_slice(b);
  require_float(b, n);
  const bool f32 = n.dtype == DType::F32;
  // Attention's operands may be permutes in the body (its layout views): it reads its buffers itself.
  if (n.op == OpKind::Attention) return f32 ? make_attention<float>(b, n) : make_attention<double>(b, n);
  const auto& xb = b.in_of(n.inputs.at(0));
  const auto& yb = b.out(0);
  const std::size_t rank = xb.shape.size();
  switch (n.op) {
    case OpKind::Softmax:
    case OpKind::LogSoftmax: {
      auto k = std::make_unique<SoftmaxKernel>();
      k->x = xb.id, k->y = yb.id, k->dtype = n.dtype, k->log = n.op == OpKind::LogSoftmax;
      if (rank > 0) {
        auto axis = std::size_t(ir::normalize_axis(n.attrs.int_or("axis", -1), rank));
        k->outer = 1, k->inner = 1;
        for (std::size_t d = 0; d < axis; ++d) k->outer *= xb.shape[d];
        for (std::size_t d = axis + 1; d < rank; ++d) k->inner *= xb.shape[d];
        k->n = xb.shape[axis];
      }
      return k;
    }
    case OpKind::LayerNorm:
    case OpKind::RmsNorm: {
      auto k = std::make_unique<NormKernel>();
      k->x = xb.id, k->y = yb.id, k->dtype = n.dtype, k->rms = n.op == OpKind::RmsNorm;
      k->eps = n.attrs.get_float("eps");
      std::size_t axis = rank ? rank - 1 : 0;
      if (!k->rms && rank) axis = std::size_t(ir::normalize_axis(n.attrs.int_or("axis", -1), rank));
      k->rows = 1, k->n = 1;
      for (std::size_t d = 0; d < rank; ++d) (d < axis ? k->rows : k->n) *= xb.shape[d];
      if (n.inputs.size() > 1) k->gamma = b.in_of(n.inputs[1]).id;
      if (n.inputs.size() > 2) k->beta = b.in_of(n.inputs[2]).id;
      return k;
    }
    case OpKind::Conv1d:
    case OpKind::Conv2d: return f32 ? make_conv<float>(b, n) : make_conv<double>(b, n);
    case OpKind::MaxPool2d:
    case OpKind::AvgPool2d: return f32 ? make_pool<float>(b, n) : make_pool<double>(b, n);
    case OpKind::Rope: return f32 ? make_rope<float>(b, n) : make_rope<double>(b, n);
    case OpKind::SoftmaxBackward:
    case OpKind::LayerNormBackward:
    case OpKind::RmsNormBackward: return build_backward(b);
    default: b.fail("op " + std::string(ir::op_name(n.op)) + " has no native CPU kernel");
  }
}

}  // namespace rlx::backends::cpu
