// The K-quants (256-element super-blocks of 16- or 32-element sub-blocks) and Q8_K. The quantizers
// are llama.cpp's reference ones (quantize_row_q*_K_ref in ggml-quants.c, the path without an
// importance matrix), written out again here operation by operation so that every float rounds
// where ggml's does: tests/gguf/test_quants.cpp compares the bytes with llama.cpp's. The order of
// the float operations inside each expression is part of the format, so keep it when editing.
#include <algorithm>
#include <cmath>

#include "ir/quants_impl.hpp"

namespace rlx::ir::detail {
namespace {

constexpr float kGroupMaxEps = 1e-15f;  // ggml's GROUP_MAX_EPS: a sub-block below it is all zero

inline std::uint8_t to_u8(int v) { return static_cast<std::uint8_t>(v); }  // modulo 256, as C's conversion
inline int clampi(int v, int lo, int hi) { return std::max(lo, std::min(hi, v)); }

// The 6-bit scale and min of sub-block j of Q4_K and Q5_K (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const std::uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The 6-bit scale j (0..15) of Q3_K, still biased by 32: the low four bits in the nibbles of
// scales[0..7], the high two in the bit pairs of scales[8..11].
inline int scale_q3k(const std::uint8_t* s, int j) {
  const int low = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
  return low | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4;
}

// Four 2-bit planes: element j + l + 32 * k of each 128 in bits 2k of qs[j/4 + l] (Q2_K and Q3_K).
inline void pack_2bit(const std::uint8_t* L, std::uint8_t* qs) {
  for (int j = 0; j < kQKK; j += 128)
    for (int l = 0; l < 32; ++l)
      qs[j / 4 + l] = to_u8(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

// ---- ggml's helper searches, same names ----

// Scale for n values to signed quants in [-nmax, nmax - 1] (stored + nmax in L), weighted by x^2
// (rmse_type 1, no importance weights: the only form the reference quantizers use). Tries 18
// scales around the max's and keeps the best weighted least-squares fit.
float make_qx_quants(int n, int nmax, const float* x, std::int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, std::int8_t{0});
    return 0.0f;
  }
  const auto fnmax = static_cast<float>(nmax);
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<std::int8_t>(l + nmax);
    const float w = x[i] * x[i];
    const auto fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(fnmax + 0.1f * static_cast<float>(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const auto fl = static_cast<float>(clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * fl;
      suml2 += w * fl * fl;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i)
        L[i] = static_cast<std::int8_t>(nmax + clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q3_K's sub-block search: signed quants in [-nmax, nmax - 1], then up to five passes that move
// single quants while the x^2-weighted fit improves (ggml's make_q3_quants with do_rmse).
float make_q3_quants(int n, int nmax, const float* x, std::int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, std::int8_t{0});
    return 0.0f;
  }
  const float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<std::int8_t>(l);
    const float w = x[i] * x[i];
    const auto fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      const auto li = static_cast<float>(L[i]);
      float slx = sumlx - w * x[i] * li;
      if (slx > 0) {
        float sl2 = suml2 - w * li * li;
        const int new_l = clampi(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
        if (new_l != L[i]) {
          const auto fl = static_cast<float>(new_l);
          slx += w * x[i] * fl;
          sl2 += w * fl * fl;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<std::int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (n_changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<std::int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Scale and min for n values to unsigned quants in [0, nmax] (x ~ scale * q - the_min), weighted:
// the min-max fit, then nstep + 1 scales from (nmax + rmin) to (nmax + rmin + nstep * rdelta),
// each refit by weighted least squares; keeps the one of least weighted error (absolute error
// with use_mad, squared otherwise). ggml's make_qkx2_quants.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, std::uint8_t* L, float& the_min,
                       std::uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, std::uint8_t{0});
    the_min = -min;
    return 0.0f;
  }
  const auto fnmax = static_cast<float>(nmax);
  float iscale = fnmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = to_u8(clampi(nearest_int(iscale * (x[i] - min)), 0, nmax));
    float diff = scale * static_cast<float>(L[i]) + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + fnmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = to_u8(l);
      const float w = weights[i];
      const auto fl = static_cast<float>(l);
      sum_l += w * fl;
      sum_l2 += w * fl * fl;
      sum_xl += w * fl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * static_cast<float>(Laux[i]) + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        std::copy(Laux, Laux + n, L);
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  the_min = -min;
  return scale;
}

// Q4_K and Q5_K share everything but the quant width and the search range.
template <class Block, int kNmax>
Block quantize_k4_block(const float* x, float rmin, int nstep, std::uint8_t* L) {
  float mins[kQKK / 32], scales[kQKK / 32], weights[32];
  std::uint8_t Laux[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < kQKK / 32; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = make_qkx2_quants(32, kNmax, xs, weights, L + 32 * j, mins[j], Laux, rmin, 0.1f, nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  Block b{};
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  for (int j = 0; j < kQKK / 32; ++j) {
    const int ls = std::min(63, int{to_u8(nearest_int(inv_scale * scales[j]))});
    const int lm = std::min(63, int{to_u8(nearest_int(inv_min * mins[j]))});
    if (j < 4) {
      b.scales[j] = to_u8(ls);
      b.scales[j + 4] = to_u8(lm);
    } else {
      b.scales[j + 4] = to_u8((ls & 0x0f) | ((lm & 0x0f) << 4));
      b.scales[j - 4] = to_u8(b.scales[j - 4] | ((ls >> 4) << 6));
      b.scales[j] = to_u8(b.scales[j] | ((lm >> 4) << 6));
    }
  }
  b.d = f32_to_f16(max_scale / 63.f);
  b.dmin = f32_to_f16(max_min / 63.f);
  for (int j = 0; j < kQKK / 32; ++j) {
    int sc, m;
    scale_min_k4(j, b.scales, sc, m);
    const float d = f16_to_f32(b.d) * static_cast<float>(sc);
    if (d == 0.0f) continue;  // keeps the search's quants, as ggml does
    const float dm = f16_to_f32(b.dmin) * static_cast<float>(m);
    for (int ii = 0; ii < 32; ++ii) L[32 * j + ii] = to_u8(clampi(nearest_int((x[32 * j + ii] + dm) / d), 0, kNmax));
  }
  return b;
}

}  // namespace

// ---- quantize ----

void quantize_q2_k(const float* x, std::byte* out, std::size_t nblocks) {
  constexpr float q4scale = 15.f;
  for (std::size_t i = 0; i < nblocks; ++i, x += kQKK) {
    std::uint8_t L[kQKK], Laux[16];
    float weights[16], mins[kQKK / 16], scales[kQKK / 16];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < kQKK / 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, mins[j], Laux, -0.5f, 0.1f, 15, true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    BlockQ2_K b{};
    if (max_scale > 0) {
      const float iscale = q4scale / max_scale;
      for (int j = 0; j < kQKK / 16; ++j) b.scales[j] = to_u8(nearest_int(iscale * scales[j]));
      b.d = f32_to_f16(max_scale / q4scale);
    } else {
      b.d = f32_to_f16(0.f);
    }
    if (max_min > 0) {
      const float iscale = q4scale / max_min;
      for (int j = 0; j < kQKK / 16; ++j) b.scales[j] = to_u8(b.scales[j] | (nearest_int(iscale * mins[j]) << 4));
      b.dmin = f32_to_f16(max_min / q4scale);
    } else {
      b.dmin = f32_to_f16(0.f);
    }
    for (int j = 0; j < kQKK / 16; ++j) {
      const float d = f16_to_f32(b.d) * static_cast<float>(b.scales[j] & 0x0f);
      if (d == 0.0f) continue;
      const float dm = f16_to_f32(b.dmin) * static_cast<float>(b.scales[j] >> 4);
      for (int ii = 0; ii < 16; ++ii) L[16 * j + ii] = to_u8(clampi(nearest_int((x[16 * j + ii] + dm) / d), 0, 3));
    }
    pack_2bit(L, b.qs);
    store_block(b, out + i * sizeof b);
  }
}

void quantize_q3_k(const float* x, std::byte* out, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, x += kQKK) {
    std::int8_t L[kQKK];
    float scales[kQKK / 16];
    float max_scale = 0, amax = 0;
    for (int j = 0; j < kQKK / 16; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
      const float scale = std::fabs(scales[j]);
      if (scale > amax) {
        amax = scale;
        max_scale = scales[j];
      }
    }
    BlockQ3_K b{};
    if (max_scale != 0.0f) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < kQKK / 16; ++j) {
        // ggml stores nearest_int in an int8_t before clamping it.
        const auto l8 = static_cast<std::int8_t>(nearest_int(iscale * scales[j]));
        const int l = clampi(l8, -32, 31) + 32;
        if (j < 8) {
          b.scales[j] = to_u8(l & 0x0f);
        } else {
          b.scales[j - 8] = to_u8(b.scales[j - 8] | ((l & 0x0f) << 4));
        }
        b.scales[j % 4 + 8] = to_u8(b.scales[j % 4 + 8] | ((l >> 4) << (2 * (j / 4))));
      }
      b.d = f32_to_f16(1 / iscale);
    } else {
      b.d = f32_to_f16(0.f);
    }
    for (int j = 0; j < kQKK / 16; ++j) {
      const int sc = scale_q3k(b.scales, j) - 32;
      const float d = f16_to_f32(b.d) * static_cast<float>(sc);
      if (d == 0.0f) continue;
      for (int ii = 0; ii < 16; ++ii)
        L[16 * j + ii] = static_cast<std::int8_t>(clampi(nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
    }
    // The high bit of quant j goes to bit j / 32 of hmask[j % 32].
    for (int j = 0; j < kQKK; ++j) {
      if (L[j] > 3) {
        b.hmask[j % 32] = to_u8(b.hmask[j % 32] | (1 << (j / 32)));
        L[j] = static_cast<std::int8_t>(L[j] - 4);
      }
    }
    std::uint8_t Lu[kQKK];
    for (int j = 0; j < kQKK; ++j) Lu[j] = to_u8(L[j]);
    pack_2bit(Lu, b.qs);
    store_block(b, out + i * sizeof b);
  }
}

void quantize_q4_k(const float* x, std::byte* out, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, x += kQKK) {
    std::uint8_t L[kQKK];
    auto b = quantize_k4_block<BlockQ4_K, 15>(x, -1.f, 20, L);
    for (int j = 0; j < kQKK; j += 64)
      for (int l = 0; l < 32; ++l) b.qs[j / 2 + l] = to_u8(L[j + l] | (L[j + l + 32] << 4));
    store_block(b, out + i * sizeof b);
  }
}

void quantize_q5_k(const float* x, std::byte* out, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, x += kQKK) {
    std::uint8_t L[kQKK];
    auto b = quantize_k4_block<BlockQ5_K, 31>(x, -0.5f, 15, L);
    // Sub-block s (32 quants) has its fifth bits in bit s of qh[0..31].
    for (int n = 0, s = 0; n < kQKK; n += 64, s += 2) {
      for (int j = 0; j < 32; ++j) {
        const int l1 = L[n + j], l2 = L[n + j + 32];
        if (l1 > 15) b.qh[j] = to_u8(b.qh[j] | (1 << s));
        if (l2 > 15) b.qh[j] = to_u8(b.qh[j] | (1 << (s + 1)));
        b.qs[n / 2 + j] = to_u8((l1 & 0x0f) | ((l2 & 0x0f) << 4));
      }
    }
    store_block(b, out + i * sizeof b);
  }
}

void quantize_q6_k(const float* x, std::byte* out, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, x += kQKK) {
    std::int8_t L[kQKK];
    float scales[kQKK / 16];
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < kQKK / 16; ++ib) {
      scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
      const float abs_scale = std::fabs(scales[ib]);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scales[ib];
      }
    }
    BlockQ6_K b{};
    if (max_abs_scale < kGroupMaxEps) {  // all zero: d = 0 and zero bytes
      b.d = f32_to_f16(0.f);
      store_block(b, out + i * sizeof b);
      continue;
    }
    const float iscale = -128.f / max_scale;
    b.d = f32_to_f16(1 / iscale);
    for (int ib = 0; ib < kQKK / 16; ++ib)
      b.scales[ib] = static_cast<std::int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    for (int j = 0; j < kQKK / 16; ++j) {
      const float d = f16_to_f32(b.d) * static_cast<float>(b.scales[j]);
      if (d == 0.0f) continue;
      for (int ii = 0; ii < 16; ++ii)
        L[16 * j + ii] = static_cast<std::int8_t>(clampi(nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
    }
    // Each 128: quant l + 32k has its low nibble in ql (k = 0, 1 low; 2, 3 high nibbles of
    // ql[l], ql[l + 32]) and its high two bits in bits 2k of qh[l].
    for (int j = 0; j < kQKK; j += 128) {
      std::uint8_t* ql = b.ql + j / 2;
      std::uint8_t* qh = b.qh + j / 4;
      for (int l = 0; l < 32; ++l) {
        const int q1 = to_u8(L[j + l]), q2 = to_u8(L[j + l + 32]);  // in [0, 63]
        const int q3 = to_u8(L[j + l + 64]), q4 = to_u8(L[j + l + 96]);
        ql[l] = to_u8((q1 & 0x0f) | ((q3 & 0x0f) << 4));
        ql[l + 32] = to_u8((q2 & 0x0f) | ((q4 & 0x0f) << 4));
        qh[l] = to_u8((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
      }
    }
    store_block(b, out + i * sizeof b);
  }
}

void quantize_q8_k(const float* x, std::byte* out, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, x += kQKK) {
    float max = 0, amax = 0;
    for (int j = 0; j < kQKK; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    BlockQ8_K b{};  // an all-zero block: d = 0, zero quants and zero sums
    if (amax != 0.0f) {
      const float iscale = -127.f / max;
      for (int j = 0; j < kQKK; ++j) b.qs[j] = static_cast<std::int8_t>(std::min(127, nearest_int(iscale * x[j])));
      for (int j = 0; j < kQKK / 16; ++j) {
        int sum = 0;
        for (int ii = 0; ii < 16; ++ii) sum += b.qs[j * 16 + ii];
        b.bsums[j] = static_cast<std::int16_t>(sum);
      }
      b.d = 1 / iscale;
    }
    store_block(b, out + i * sizeof b);
  }
}

// ---- dequantize: ggml's dequantize_row_q*_K, the same products gguf.quants forms ----

void dequantize_q2_k(const std::byte* in, float* y, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, y += kQKK) {
    const auto b = load_block<BlockQ2_K>(in + i * sizeof(BlockQ2_K));
    const float d = f16_to_f32(b.d), min = f16_to_f32(b.dmin);
    // Element e: 128-half h = e / 128, plane k = e % 128 / 32, byte l = e % 32; sub-block e / 16.
    for (int e = 0; e < kQKK; ++e) {
      const int h = e / 128, k = e % 128 / 32, l = e % 32;
      const int sc = b.scales[e / 16];
      const float dl = d * static_cast<float>(sc & 0x0f), ml = min * static_cast<float>(sc >> 4);
      y[e] = dl * static_cast<float>((b.qs[32 * h + l] >> (2 * k)) & 3) - ml;
    }
  }
}

void dequantize_q3_k(const std::byte* in, float* y, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, y += kQKK) {
    const auto b = load_block<BlockQ3_K>(in + i * sizeof(BlockQ3_K));
    const float d = f16_to_f32(b.d);
    for (int e = 0; e < kQKK; ++e) {
      const int h = e / 128, k = e % 128 / 32, l = e % 32;
      const float dl = d * static_cast<float>(scale_q3k(b.scales, e / 16) - 32);
      const int low = (b.qs[32 * h + l] >> (2 * k)) & 3;
      const int q = low - (((b.hmask[l] >> (e / 32)) & 1) != 0 ? 0 : 4);
      y[e] = dl * static_cast<float>(q);
    }
  }
}

void dequantize_q4_k(const std::byte* in, float* y, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, y += kQKK) {
    const auto b = load_block<BlockQ4_K>(in + i * sizeof(BlockQ4_K));
    const float d = f16_to_f32(b.d), min = f16_to_f32(b.dmin);
    for (int s = 0; s < kQKK / 32; ++s) {  // sub-block s: nibble s % 2 of qs[32 * (s / 2) + l]
      int sc, m;
      scale_min_k4(s, b.scales, sc, m);
      const float d1 = d * static_cast<float>(sc), m1 = min * static_cast<float>(m);
      const std::uint8_t* q = b.qs + 32 * (s / 2);
      for (int l = 0; l < 32; ++l) y[32 * s + l] = d1 * static_cast<float>((q[l] >> (4 * (s % 2))) & 0x0f) - m1;
    }
  }
}

void dequantize_q5_k(const std::byte* in, float* y, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, y += kQKK) {
    const auto b = load_block<BlockQ5_K>(in + i * sizeof(BlockQ5_K));
    const float d = f16_to_f32(b.d), min = f16_to_f32(b.dmin);
    for (int s = 0; s < kQKK / 32; ++s) {
      int sc, m;
      scale_min_k4(s, b.scales, sc, m);
      const float d1 = d * static_cast<float>(sc), m1 = min * static_cast<float>(m);
      const std::uint8_t* q = b.qs + 32 * (s / 2);
      for (int l = 0; l < 32; ++l) {
        const int qv = ((q[l] >> (4 * (s % 2))) & 0x0f) | ((b.qh[l] >> s) & 1) << 4;
        y[32 * s + l] = d1 * static_cast<float>(qv) - m1;
      }
    }
  }
}

void dequantize_q6_k(const std::byte* in, float* y, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, y += kQKK) {
    const auto b = load_block<BlockQ6_K>(in + i * sizeof(BlockQ6_K));
    const float d = f16_to_f32(b.d);
    for (int e = 0; e < kQKK; ++e) {
      const int h = e / 128, k = e % 128 / 32, l = e % 32;
      const int low = (b.ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0f;
      const int high = (b.qh[32 * h + l] >> (2 * k)) & 3;
      const int sub = e / 16;
      y[e] = d * static_cast<float>(b.scales[sub]) * static_cast<float>((low | high << 4) - 32);
    }
  }
}

void dequantize_q8_k(const std::byte* in, float* y, std::size_t nblocks) {
  for (std::size_t i = 0; i < nblocks; ++i, y += kQKK) {
    const auto b = load_block<BlockQ8_K>(in + i * sizeof(BlockQ8_K));
    for (int j = 0; j < kQKK; ++j) y[j] = b.d * static_cast<float>(b.qs[j]);
  }
}

}  // namespace rlx::ir::detail
