// MatMul kernels: GEMM per panel (OpenBLAS, or for f32 the packed-B GEMM of
// isa/gemm_impl.inc with B packed once, packed per run, or read in place),
// then the epilogue program (one or several outputs) over the panel while it
// is still in cache. B may arrive transposed (a permute in the body, see
// BackendTraits::matmul_transposed_b): both GEMMs read it without a copy.
#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string_view>
#include <tuple>

#include "backends/cpu/gemm_pack.hpp"
#include "backends/cpu/kernels.hpp"
#include "backends/cpu/lowp_chain.hpp"
#include "backends/cpu/lowp_gemm.hpp"
#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/quants.hpp"

namespace rlx::backends::cpu {

namespace {

// B[p, j] is at b[p * sk + j * sn].
template <class T>
void gemm_int(const T* a, const T* b, T* c, i64 m, i64 n, i64 k, i64 lda, i64 sk, i64 sn, i64 ldc, std::uint64_t* row) {
  // Wrapping unsigned sums give the low bits of the exact sum, which is what the store keeps.
  for (i64 i = 0; i < m; ++i) {
    std::fill(row, row + n, 0);
    for (i64 p = 0; p < k; ++p) {
      auto av = std::uint64_t(std::int64_t(a[i * lda + p]));
      const T* br = b + p * sk;
      for (i64 j = 0; j < n; ++j) row[j] += av * std::uint64_t(std::int64_t(br[j * sn]));
    }
    for (i64 j = 0; j < n; ++j) c[i * ldc + j] = T(std::int64_t(row[j]));
  }
}

// dst[i] = src[i] widened from `from` (bf16, f16, i8 or u8) to `to` (f32 or i32), exactly.
void widen(const std::byte* src, ir::DType from, std::byte* dst, ir::DType to, i64 n, int max_threads) {
  parallel_for(
      n, kGrain,
      [&](i64 i0, i64 i1) {
        auto each = [&](auto convert) {
          for (i64 i = i0; i < i1; ++i) convert(i);
        };
        const auto* h = reinterpret_cast<const std::uint16_t*>(src);
        auto* f = reinterpret_cast<float*>(dst);
        auto* w = reinterpret_cast<std::int32_t*>(dst);
        if (to == ir::DType::F32 && from == ir::DType::BF16)
          each([&](i64 i) { f[i] = ir::bf16_to_f32(h[i]); });
        else if (to == ir::DType::F32)
          each([&](i64 i) { f[i] = ir::f16_to_f32(h[i]); });
        else if (from == ir::DType::I8)
          each([&](i64 i) {
            w[i] = reinterpret_cast<const std::int8_t*>(src)[i];  // NOLINT(bugprone-signed-char-misuse): i8 data
          });
        else
          each([&](i64 i) { w[i] = reinterpret_cast<const std::uint8_t*>(src)[i]; });
      },
      max_threads);
}

class MatMulKernel final : public CpuKernel {
 public:
  ir::DType dtype = ir::DType::F32;
  // The types A and B are stored in: the matmul's, or narrower under a widening cast (lower.cpp absorbs those).
  ir::DType a_dtype = ir::DType::F32, b_dtype = ir::DType::F32;
  i64 a_numel = 0, b_numel = 0;
  // How a narrow operand is read: by a low-precision GEMM (lowp_gemm.hpp), or widened into shared scratch
  // (at a_wide / b_wide) for the GEMMs below when the table has no kernel for the pair.
  enum class Lowp : std::uint8_t { None, Int8, Bf16, Widen };
  Lowp lowp = Lowp::None;
  const LowpTable* lowp_table = nullptr;
  std::size_t a_wide = 0, b_wide = 0, rowsum_offset = 0;
  i64 M = 0, N = 0, K = 0;
  std::vector<i64> a_off, b_off;  // element offsets of each batch's A and B
  compile::BufferId a_buf = 0, b_buf = 0, out_buf = 0;
  bool c_in_out = true;  // the GEMM writes the output buffer (else shared scratch)
  std::unique_ptr<CompiledProgram> epi;
  // An int8 matmul's epilogue as the GEMM's fused store (lowp_chain.hpp), in place of `epi`.
  std::optional<Int8Chain> chain;
  i64 pm = 1, pn = 1;  // panels per matrix along M and N
  // Where the GEMM takes B from. The packed-B GEMM's units split each matrix
  // into pm row blocks x pn groups of gemm_nr-column panels.
  enum class BSource : std::uint8_t {
    Blas,          // OpenBLAS (or the integer loop) reads B itself
    PackedOnce,    // a weight packed ahead: pointer-table entry `packed` (gemm_pack.hpp)
    PackedPerRun,  // an activation packed by each run into shared scratch at pack_offset
    InPlace,       // an activation read where it is (its rows fill whole vectors)
    // B^T [N, K] an activation and A few rows (a backward pass's dX = dY W^T): C^T = B^T A^T is computed with
    // B^T as the GEMM's A, read in place, and A packed per run as its B (M columns, a small copy), then
    // transposed into C. That spares packing all of B^T on every run (run_swapped).
    Swapped,
  };
  BSource b_source = BSource::Blas;
  std::int32_t packed = -1;
  bool b_trans = false;      // b_buf holds B^T: [.., N, K]
  bool b_rounded = false;    // b_buf holds f32 that the packed copy rounds to b_dtype (bf16): a narrowed param
  bool b_per_batch = false;  // PackedPerRun: one copy per batch (B is not shared)
  std::size_t pack_offset = 0, pack_floats = 0;
  std::size_t ct_offset = 0;  // Swapped: C^T [N, M] in shared scratch
  std::size_t row_bytes() const { return (std::size_t(N) * 8 + 63) / 64 * 64; }

  std::string strategy() const override {
    static constexpr const char* kLowp[] = {"", "int8 ", "bf16 ", "widened "};
    static constexpr const char* kSource[] = {"blas", "packed once", "packed per run", "in place", "swapped"};
    return std::string(kLowp[int(lowp)]) + kSource[int(b_source)] + (b_trans ? ", B^T" : "") + ", " +
           std::to_string(pm) + "x" + std::to_string(pn) + " units";
  }

  // The epilogue over rows [m0, m1) x columns [n0, n1) of matrix bi.
  void epilogue(const RunCtx& c, std::byte* const* aux, i64 bi, i64 m0, i64 m1, i64 n0, i64 n1) const {
    EwCtx ec{c.ptrs, aux, c.thread_scratch() + row_bytes()};
    const i64 base = (bi * M + m0) * N;
    if (n1 - n0 == N) {
      c.isa->ew_run(epi->view, ec, base, base + (m1 - m0) * N);
    } else {
      for (i64 r = 0; r < m1 - m0; ++r) c.isa->ew_run(epi->view, ec, base + r * N + n0, base + r * N + n1);
    }
  }

  void run_packed(const RunCtx& c) const {
    auto* cbase = reinterpret_cast<float*>(c_in_out ? c.ptrs[out_buf] : c.shared);
    std::byte* aux[1] = {reinterpret_cast<std::byte*>(cbase)};
    const auto* a = reinterpret_cast<const float*>(c.ptrs[a_buf]);
    const i64 nr = c.isa->gemm_nr, panels = (N + nr - 1) / nr;
    const auto* b_src = reinterpret_cast<const float*>(c.ptrs[b_buf]);
    const float* bp = nullptr;
    if (b_source == BSource::PackedPerRun) {
      auto* dst = reinterpret_cast<float*>(c.shared + pack_offset);
      const i64 copies = b_per_batch ? i64(b_off.size()) : 1;
      parallel_for(
          copies * panels, 1,
          [&](i64 u0, i64 u1) {
            for (i64 u = u0; u < u1; ++u) {
              const auto bi = std::size_t(u / panels);
              const i64 p = u % panels;
              if (b_trans)
                c.isa->gemm_pack_bt(b_src + b_off[bi], K, K, N, dst + bi * pack_floats, p, p + 1);
              else
                c.isa->gemm_pack_b(b_src + b_off[bi], N, K, N, dst + bi * pack_floats, p, p + 1);
            }
          },
          c.max_threads);
      bp = dst;
    } else if (b_source == BSource::PackedOnce) {
      bp = reinterpret_cast<const float*>(c.ptrs[packed]);
    }
    const bool in_place = b_source == BSource::InPlace;
    const i64 ldb = in_place ? N : nr, panel_stride = in_place ? nr : K * nr;
    auto unit = [&](i64 u) {
      const i64 bi = u / (pm * pn), mi = u / pn % pm, ni = u % pn;
      const i64 m0 = M * mi / pm, m1 = M * (mi + 1) / pm, p0 = panels * ni / pn, p1 = panels * (ni + 1) / pn;
      const float* b =
          in_place ? b_src + b_off[std::size_t(bi)] : bp + (b_per_batch ? std::size_t(bi) * pack_floats : 0);
      c.isa->gemm_packed(a + a_off[std::size_t(bi)], K, b, ldb, panel_stride, K, N, cbase + bi * M * N, N, m0, m1, p0,
                         p1);
      if (epi) epilogue(c, aux, bi, m0, m1, p0 * nr, std::min(N, p1 * nr));
    };
    parallel_for(
        i64(a_off.size()) * pm * pn, 1,
        [&](i64 u0, i64 u1) {
          for (i64 u = u0; u < u1; ++u) unit(u);
        },
        c.max_threads);
  }

  // BSource::Swapped: units of pm row blocks of C^T (columns of C); batch 1.
  void run_swapped(const RunCtx& c) const {
    auto* cbase = reinterpret_cast<float*>(c_in_out ? c.ptrs[out_buf] : c.shared);
    std::byte* aux[1] = {reinterpret_cast<std::byte*>(cbase)};
    const auto* a = reinterpret_cast<const float*>(c.ptrs[a_buf]);
    const auto* bt = reinterpret_cast<const float*>(c.ptrs[b_buf]);
    auto* packed = reinterpret_cast<float*>(c.shared + pack_offset);
    auto* ct = reinterpret_cast<float*>(c.shared + ct_offset);
    const i64 nr = c.isa->gemm_nr, panels = (M + nr - 1) / nr;
    // A [M, K] is the transpose of the GEMM's B, A^T [K, M]: packed as a B^T.
    parallel_for(
        panels, 1, [&](i64 p0, i64 p1) { c.isa->gemm_pack_bt(a + a_off[0], K, K, M, packed, p0, p1); }, c.max_threads);
    parallel_for(
        pm, 1,
        [&](i64 u0, i64 u1) {
          for (i64 u = u0; u < u1; ++u) {
            const i64 n0 = N * u / pm, n1 = N * (u + 1) / pm;
            c.isa->gemm_packed(bt + b_off[0], K, packed, nr, K * nr, K, M, ct, M, n0, n1, 0, panels);
            // C^T rows [n0, n1) are C's columns [n0, n1).
            c.isa->transpose32(reinterpret_cast<const std::uint32_t*>(ct + n0 * M), M,
                               reinterpret_cast<std::uint32_t*>(cbase + n0), N, n1 - n0, M);
            if (epi) epilogue(c, aux, 0, 0, M, n0, n1);
          }
        },
        c.max_threads);
  }

  // The int8 and bf16 GEMMs: B packed once (a weight) or by this run into shared scratch, in the table's panels.
  void run_lowp(const RunCtx& c) const {
    std::byte* cbase = c_in_out ? c.ptrs[out_buf] : c.shared;
    std::byte* aux[1] = {cbase};
    const LowpTable& t = *lowp_table;
    const bool int8 = lowp == Lowp::Int8;
    const i64 nr = int8 ? t.i8_nr : t.bf16_nr, panels = (N + nr - 1) / nr;
    const std::size_t as = ir::dtype_size(a_dtype), bs = ir::dtype_size(b_dtype);
    const bool b_unsigned = b_dtype == ir::DType::U8, a_unsigned = a_dtype == ir::DType::U8;
    const std::byte* bp = nullptr;
    I8EpiStep steps[Int8Chain::kMaxSteps];
    I8Epilogue fused;
    if (chain) fused = chain->bind(c, steps);
    const std::size_t out_size = fused.out == I8Epilogue::F32 ? 4 : 1;
    if (b_source == BSource::PackedPerRun) {
      std::byte* dst = c.shared + pack_offset;
      const i64 copies = b_per_batch ? i64(b_off.size()) : 1;
      const i64 ldb = b_trans ? K : N;
      parallel_for(
          copies * panels, 1,
          [&](i64 u0, i64 u1) {
            for (i64 u = u0; u < u1; ++u) {
              const auto bi = std::size_t(u / panels);
              const i64 p = u % panels;
              const std::byte* src = c.ptrs[b_buf] + std::size_t(b_off[bi]) * bs;
              std::byte* out = dst + bi * pack_floats * 4;
              if (int8)
                t.i8_pack_b(reinterpret_cast<const std::uint8_t*>(src), b_unsigned, b_trans, ldb, K, N, out, p, p + 1);
              else
                t.bf16_pack_b(reinterpret_cast<const std::uint16_t*>(src), b_trans, ldb, K, N, out, p, p + 1);
            }
          },
          c.max_threads);
      bp = dst;
    } else {
      bp = c.ptrs[packed];
    }
    auto unit = [&](i64 u) {
      const i64 bi = u / (pm * pn), mi = u / pn % pm, ni = u % pn;
      const i64 m0 = M * mi / pm, m1 = M * (mi + 1) / pm, p0 = panels * ni / pn, p1 = panels * (ni + 1) / pn;
      const std::byte* a = c.ptrs[a_buf] + std::size_t(a_off[std::size_t(bi)]) * as;
      const std::byte* b = bp + (b_per_batch ? std::size_t(bi) * pack_floats * 4 : 0);
      std::byte* cm = cbase + std::size_t(bi * M * N) * 4;
      if (int8) {
        auto* rowsum = reinterpret_cast<std::int32_t*>(c.thread_scratch() + rowsum_offset);
        if (chain && t.i8_gemm_fused) {
          I8Epilogue e = fused;
          e.dst += std::size_t(bi * M * N) * out_size;
          e.ldd = N;
          if (t.i8_gemm_fused(reinterpret_cast<const std::uint8_t*>(a), a_unsigned, K, b, b_unsigned, K, N, m0, m1, p0,
                              p1, rowsum, e))
            return;
        }
        t.i8_gemm(reinterpret_cast<const std::uint8_t*>(a), a_unsigned, K, b, b_unsigned, K, N,
                  reinterpret_cast<std::int32_t*>(cm), N, m0, m1, p0, p1, rowsum);
        if (chain) {
          I8Epilogue e = fused;
          e.dst += std::size_t(bi * M * N) * out_size;
          e.ldd = N;
          t.i8_epilogue(cm, N, m0, m1, p0 * nr, std::min(N, p1 * nr), e);
          return;
        }
      } else {
        t.bf16_gemm(reinterpret_cast<const std::uint16_t*>(a), K, b, K, N, reinterpret_cast<float*>(cm), N, m0, m1, p0,
                    p1);
      }
      if (epi) epilogue(c, aux, bi, m0, m1, p0 * nr, std::min(N, p1 * nr));
    };
    parallel_for(
        i64(a_off.size()) * pm * pn, 1,
        [&](i64 u0, i64 u1) {
          for (i64 u = u0; u < u1; ++u) unit(u);
        },
        c.max_threads);
  }

  void run(const RunCtx& c) const override {
    if (lowp == Lowp::Int8 || lowp == Lowp::Bf16) return run_lowp(c);
    if (b_source == BSource::Swapped) return run_swapped(c);
    if (b_source != BSource::Blas) return run_packed(c);
    const i64 batch = i64(a_off.size());
    std::byte* cbase = c_in_out ? c.ptrs[out_buf] : c.shared;
    std::byte* aux[1] = {cbase};
    const std::size_t es = ir::dtype_size(dtype);
    // Narrow operands without a low-precision kernel: widened once per run, then the GEMMs below.
    const std::byte* a_base = c.ptrs[a_buf];
    const std::byte* b_base = c.ptrs[b_buf];
    if (a_dtype != dtype) {
      widen(a_base, a_dtype, c.shared + a_wide, dtype, a_numel, c.max_threads);
      a_base = c.shared + a_wide;
    }
    if (b_dtype != dtype) {
      widen(b_base, b_dtype, c.shared + b_wide, dtype, b_numel, c.max_threads);
      b_base = c.shared + b_wide;
    }
    auto unit = [&](i64 u) {
      i64 bi = u / (pm * pn), mi = u / pn % pm, ni = u % pn;
      i64 m0 = M * mi / pm, m1 = M * (mi + 1) / pm;
      i64 n0 = ni == 0 ? 0 : (N * ni / pn + 15) / 16 * 16, n1 = ni + 1 == pn ? N : (N * (ni + 1) / pn + 15) / 16 * 16;
      if (m0 >= m1 || n0 >= n1) return;
      const std::byte* A = a_base + std::size_t(a_off[std::size_t(bi)] + m0 * K) * es;
      const std::byte* B = b_base + std::size_t(b_off[std::size_t(bi)] + n0 * (b_trans ? K : 1)) * es;
      const auto tb = b_trans ? CblasTrans : CblasNoTrans;
      const int ldb = int(b_trans ? K : N);
      std::byte* C = cbase + std::size_t((bi * M + m0) * N + n0) * es;
      const i64 rows = m1 - m0, cols = n1 - n0;
      if (K == 0) {
        for (i64 r = 0; r < rows; ++r) std::memset(C + std::size_t(r * N) * es, 0, std::size_t(cols) * es);
      } else {
        switch (dtype) {
          case ir::DType::F32:
            cblas_sgemm(CblasRowMajor, CblasNoTrans, tb, int(rows), int(cols), int(K), 1.0f,
                        reinterpret_cast<const float*>(A), int(K), reinterpret_cast<const float*>(B), ldb, 0.0f,
                        reinterpret_cast<float*>(C), int(N));
            break;
          case ir::DType::F64:
            cblas_dgemm(CblasRowMajor, CblasNoTrans, tb, int(rows), int(cols), int(K), 1.0,
                        reinterpret_cast<const double*>(A), int(K), reinterpret_cast<const double*>(B), ldb, 0.0,
                        reinterpret_cast<double*>(C), int(N));
            break;
          default: {
            auto* row = reinterpret_cast<std::uint64_t*>(c.thread_scratch());
            auto go = [&](auto* t) {
              using T = std::remove_pointer_t<decltype(t)>;
              gemm_int(reinterpret_cast<const T*>(A), reinterpret_cast<const T*>(B), reinterpret_cast<T*>(C), rows,
                       cols, K, K, b_trans ? 1 : N, b_trans ? K : 1, N, row);
            };
            switch (dtype) {
              case ir::DType::I8: go(static_cast<std::int8_t*>(nullptr)); break;
              case ir::DType::U8: go(static_cast<std::uint8_t*>(nullptr)); break;
              case ir::DType::I32: go(static_cast<std::int32_t*>(nullptr)); break;
              default: go(static_cast<std::int64_t*>(nullptr)); break;
            }
          }
        }
      }
      if (epi) epilogue(c, aux, bi, m0, m1, n0, n1);
    };
    parallel_for(
        batch * pm * pn, 1,
        [&](i64 u0, i64 u1) {
          for (i64 u = u0; u < u1; ++u) unit(u);
        },
        c.max_threads);
  }
};

// Element offsets of each output batch into an operand with batch dims `dims`
// broadcast to `out` (both without the matrix dims).
std::vector<i64> batch_offsets(const std::vector<i64>& dims, const std::vector<i64>& out, i64 matrix) {
  std::vector<i64> offs(std::size_t(numel(out)), 0);
  std::vector<i64> strides(out.size(), 0);
  i64 s = matrix;
  for (std::size_t i = dims.size(); i-- > 0;) {
    std::size_t o = out.size() - dims.size() + i;
    strides[o] = dims[i] == 1 ? 0 : s;
    s *= dims[i];
  }
  std::vector<i64> idx(out.size(), 0);
  for (auto& off : offs) {
    for (std::size_t d = 0; d < out.size(); ++d) off += idx[d] * strides[d];
    for (std::size_t d = out.size(); d-- > 0;) {
      if (++idx[d] < out[d]) break;
      idx[d] = 0;
    }
  }
  return offs;
}

// RLX_CPU_GEMM=packed|blas forces the f32 GEMM for constant B (tests, benches); unset: by shape.
enum class GemmChoice { Auto, Packed, Blas };
GemmChoice gemm_override() {
  auto value = env::get("RLX_CPU_GEMM");
  if (!value) return GemmChoice::Auto;
  const std::string& v = *value;
  if (v == "packed") return GemmChoice::Packed;
  if (v == "blas") return GemmChoice::Blas;
  throw Error("RLX_CPU_GEMM='" + v + "' is not one of packed, blas");
}

// Whether the packed-B GEMM beats OpenBLAS for an M x N x K product with a
// constant B. bench/bench_gemm_packed.cpp on the 2-core Zen 4, medians of 93-155
// interleaved samples (a loaded machine), packed / RLX's OpenBLAS path and
// packed / OpenBLAS on its own threads; AVX2 against OpenBLAS's Haswell kernels:
//   M x N x K         AVX-512       AVX2
//   64x1024x1024      1.75  1.54    1.34  0.99
//   128x512x512       1.44  1.17    1.32  0.98
//   128x2048x512      1.40  0.94    1.12  0.80
//   128x512x2048      1.24  1.20    1.01  0.89
//   512x512x512       1.11  1.14    1.06  0.76
//   1024x1024x1024    1.01  1.25    0.82  0.83
//   2048x2048x2048    0.95  0.99    0.86  0.88
//   1x4096x4096       3.17  2.78    1.50  1.53
//   1024x16x1024      1.42  2.04    1.72  1.71
//   256x80x1024       1.33  1.47    1.20  1.09
//   1024x1024x32      1.26  1.33    1.12  1.18
//   32x32x32          1.04 10.4     1.40 10.0
// Packing B once saves what OpenBLAS spends repacking it per call, a share of
// the work that shrinks with M, and short K or narrow N hurt OpenBLAS more;
// once M, N and K all reach 1024 the two tie (AVX-512: 0.95-1.08 across runs)
// or OpenBLAS wins (AVX2), and a packed copy would only double B's memory.
// The generic kernel is plain C++ and never wins.
bool packed_wins(const KernelTable& isa, i64 M, i64 N, i64 K) {
  return std::string_view(isa.name) != "generic" && std::min({M, N, K}) < 1024;
}

// Whether packing an activation B on every run and running the packed GEMM
// beats OpenBLAS, which packs B itself on every call. Packing costs one pass
// over B (K x N), which pays for itself once a matrix has enough rows to reuse
// each panel; below that (GEMV-like M) B is better streamed once by OpenBLAS.
// Numbers: bench_gemm_packed --b-input 1 (docs/backends/cpu.md).
// The copy lives in scratch, so B's beyond 64 MB stay with OpenBLAS.
bool packed_per_run_wins(const KernelTable& isa, i64 M, i64 N, i64 K, i64 copies) {
  return std::string_view(isa.name) != "generic" && M >= 64 && copies * K * N <= (i64(16) << 20);
}

// Whether the packed GEMM reads an activation B in place rather than packing
// it first (the panels' rows are then N floats apart, not gemm_nr). With few
// rows each panel is met by few row tiles, so a packing pass is not repaid:
// single-threaded minimums on the Zen 4 (a loaded machine), in place / packed
// per run: 64x1024x1024 1.28, 512x512x512 1.01, 1024x1024x64 0.90; the MLP
// training step (M = 64 everywhere but the weight gradients) ran 29% faster.
bool in_place_wins(i64 M) { return M < 256; }

// Row blocks x panel groups per matrix for the packed GEMM. A block's rows
// of A stay in L2 while its panels pass (<= 192 rows); about 4 units per
// thread let the pool balance them when a core is busy elsewhere, a group
// keeps >= 2 panels so the epilogue's row segments stay long, and the unit
// count is a multiple of the threads so none idles at the end.
std::pair<i64, i64> packed_units(i64 batch, i64 M, i64 panels, double flops, int threads) {
  i64 pm = (M + 191) / 192, pn = 1;
  if (flops < (1 << 18) || threads <= 1) return {pm, pn};
  const i64 want = 4 * i64(threads);
  pn = std::clamp<i64>((want + batch * pm - 1) / (batch * pm), 1, std::max<i64>(1, panels / 2));
  if (batch * pm * pn < want) pm = std::max(pm, std::min((want + batch * pn - 1) / (batch * pn), M / 24));
  while (batch * pm * pn % threads != 0 && M / (pm + 1) >= 6) ++pm;
  return {pm, pn};
}

// Whether C = A B^T with B^T an activation is computed as C^T = B^T A^T (BSource::Swapped). Packing B^T per
// run costs a pass over all of it, repaid only by many rows of A; with few rows the swapped GEMM reads B^T in
// place and packs only A. The swapped GEMM's tiles are gemm_nr columns of C^T wide, rows of C, so below 32
// rows most of their width would be padding. On the 2-core Zen 4 (medians, interleaved), packed B^T (or
// OpenBLAS below 64 rows) against swapped: 64x1024x1024 776 -> 617 us, 128x1024x1024 1553 -> 1226,
// 32x4096x1024 4584 -> 1377; the MLP's SGD step (bench_train) 4.59 -> 4.24 ms.
bool swapped_wins(i64 M, i64 N, i64 batch) { return batch == 1 && M >= 32 && M < 256 && N >= 64; }

// An epilogue that reads operands as large as the output (an optimizer's update reads the weights beside their
// gradient) runs fastest over whole rows: a unit's share of them is then one range, which the hardware
// prefetcher streams, where units of part rows read as many short ranges as they have rows. On the 2-core
// Zen 4, w - lr * x^T dy with x and dy [64, N] (a weight gradient's GEMM, K = 64, and SGD's update): N = 1024
// 809 -> 722 us, N = 512 257 -> 188 us, and [128, 1024] 1499 -> 1391 us; the rows per unit (32 to 171) made
// no difference.
constexpr std::size_t kWholeRowsMinBytes = std::size_t(1) << 20;  // smaller operands stay in cache anyway
constexpr std::size_t kWholeRowsMaxB = std::size_t(1) << 20;

void plan_whole_rows(MatMulKernel& k, i64 batch, int threads) {
  if (!k.epi || k.pn == 1) return;
  std::size_t per_element = 0;
  for (const LoadSpec& l : k.epi->loads)
    if (l.kind == LoadKind::Contig && !l.fixed && l.buffer >= 0) per_element += ir::dtype_size(l.dtype);
  if (std::size_t(batch * k.M * k.N) * per_element < kWholeRowsMinBytes) return;
  // Every unit then reads all of B: cheap from L2, not from memory.
  if (std::size_t(k.K * k.N) * sizeof(float) > kWholeRowsMaxB) return;
  // As many units as packed_units made (>= 4 per thread where the rows allow), each of whole rows.
  k.pm = std::min(k.pm * k.pn, std::max<i64>(k.M / 6, 1));
  k.pn = 1;
  while (threads > 1 && batch * k.pm % threads != 0 && k.M / (k.pm + 1) >= 6) ++k.pm;
}

// Room for `bytes` more in the kernel's shared scratch, 64-byte aligned; returns its offset.
std::size_t reserve_shared(CpuKernel& k, std::size_t bytes) {
  const std::size_t at = (k.shared_bytes + 63) / 64 * 64;
  k.shared_bytes = at + bytes;
  return at;
}

// A matmul with a narrow operand: the table's int8 or bf16 GEMM when it has one for the pair, else the
// operands widened per run into scratch for the GEMMs of the wide type.
void build_narrow(const BuildCtx& b, const ir::Node& mm, MatMulKernel& k, const compile::Buffer& B, bool b_constant,
                  bool b_shared, double flops) {
  using ir::DType;
  const LowpTable& table = b.packs && b.packs->lowp ? *b.packs->lowp : select_lowp_table();
  auto is8 = [](DType t) { return t == DType::I8 || t == DType::U8; };
  const i64 batch = i64(k.a_off.size());
  k.lowp_table = &table;
  if (k.b_rounded && !(k.K > 0 && k.dtype == DType::F32 && k.a_dtype == DType::BF16 && table.bf16_nr > 0))
    b.fail("internal: a param narrowed to bf16 in the kernel needs the bf16 GEMM");
  if (k.K > 0 && k.dtype == DType::I32 && is8(k.a_dtype) && is8(k.b_dtype) && table.i8_nr > 0)
    k.lowp = MatMulKernel::Lowp::Int8;
  else if (k.K > 0 && k.dtype == DType::F32 && k.a_dtype == DType::BF16 && k.b_dtype == DType::BF16 &&
           table.bf16_nr > 0)
    k.lowp = MatMulKernel::Lowp::Bf16;
  else
    k.lowp = MatMulKernel::Lowp::Widen;
  auto reserve = [&](std::size_t bytes) { return reserve_shared(k, bytes); };
  if (!k.c_in_out) k.shared_bytes = std::size_t(batch * k.M * k.N) * ir::dtype_size(k.dtype);
  k.thread_bytes = k.row_bytes() + (k.epi ? k.epi->scratch_bytes : 0);
  if (k.lowp == MatMulKernel::Lowp::Widen) {
    const std::size_t es = ir::dtype_size(k.dtype);
    if (k.a_dtype != k.dtype) k.a_wide = reserve(std::size_t(k.a_numel) * es);
    if (k.b_dtype != k.dtype) k.b_wide = reserve(std::size_t(k.b_numel) * es);
    if (flops >= 1 << 18 && b.threads > 1 && batch < b.threads) {
      const i64 per = (b.threads + batch - 1) / batch;
      k.pm = std::clamp<i64>(k.M / 16, 1, per);
      k.pn = std::clamp<i64>(k.N / 64, 1, (per + k.pm - 1) / k.pm);
    }
    return;
  }
  const bool int8 = k.lowp == MatMulKernel::Lowp::Int8;
  if (int8 && k.epi) {
    k.chain = match_int8_chain(b, mm);
    if (k.chain) k.epi.reset();
  }
  const std::int32_t nr = int8 ? table.i8_nr : table.bf16_nr;
  const i64 panels = i64(lowp_panels(nr, k.N));
  const std::size_t packed_bytes =
      std::size_t(panels) * (int8 ? i8_panel_bytes(table, k.K) : bf16_panel_bytes(nr, k.K, table.bf16_k_align));
  std::tie(k.pm, k.pn) = packed_units(batch, k.M, panels, flops, b.threads);
  if (int8) {
    k.rowsum_offset = k.thread_bytes;
    k.thread_bytes += std::size_t(k.M) * sizeof(std::int32_t);
  }
  if (b.packs && b_constant && b_shared) {
    k.b_source = MatMulKernel::BSource::PackedOnce;
    PackSpec spec{int8 ? PackFormat::Int8 : PackFormat::Bf16, k.b_dtype == DType::U8, packed_bytes};
    spec.round_from_f32 = k.b_rounded;
    k.packed = b.packs->request(B.id, k.K, k.N, k.b_trans, spec);
  } else if (k.b_rounded) {
    b.fail("internal: a narrowed param needs the bf16 GEMM and a packed copy");
  } else {
    k.b_source = MatMulKernel::BSource::PackedPerRun;
    k.b_per_batch = !b_shared;
    k.pack_floats = (packed_bytes + 63) / 64 * 16;  // per copy, in 4-byte units, 64-byte aligned
    k.pack_offset = reserve(k.pack_floats * 4 * (k.b_per_batch ? std::size_t(batch) : 1));
  }
}

}  // namespace

std::unique_ptr<CpuKernel> build_matmul(const BuildCtx& b) {
  const auto& body = b.kernel.body;
  const auto& nodes = body.nodes();
  const auto mm_it =
      std::find_if(nodes.begin(), nodes.end(), [](const ir::Node& n) { return n.op == ir::OpKind::MatMul; });
  if (mm_it == nodes.end()) b.fail("expected a matmul op");
  const ir::Node& mm = *mm_it;
  // An operand's buffer, behind the widening cast (A and B) or the permute of its last two dims (B) that
  // lower.cpp absorbs.
  // B may also be a param narrowed to bf16 in the kernel (lower.cpp's absorb_narrowed_param): its buffer is the
  // f32 param, read as bf16 (`narrowed`), rounded once as it is packed.
  auto operand_node = [&](ir::NodeId id, bool* transposed, std::optional<ir::DType>* narrowed) -> const ir::Node& {
    const ir::Node* n = &body.node(id);
    if (transposed && n->op == ir::OpKind::Permute) {
      *transposed = true;
      n = &body.node(n->inputs.at(0));
    }
    if (n->op == ir::OpKind::Cast) n = &body.node(n->inputs.at(0));
    if (narrowed && n->op == ir::OpKind::Cast) {
      *narrowed = n->dtype;
      n = &body.node(n->inputs.at(0));
    }
    return *n;
  };
  bool b_trans = false;
  std::optional<ir::DType> b_narrowed;
  const auto& A = b.in_of(operand_node(mm.inputs.at(0), nullptr, nullptr).id);
  const auto& B = b.in_of(operand_node(mm.inputs.at(1), &b_trans, &b_narrowed).id);
  if (A.shape.size() < 2 || B.shape.size() < 2) b.fail("matmul operands need rank >= 2");
  auto k = std::make_unique<MatMulKernel>();
  k->b_trans = b_trans;
  k->dtype = mm.dtype;
  k->a_dtype = A.dtype;
  k->b_dtype = b_narrowed.value_or(B.dtype);
  k->b_rounded = b_narrowed.has_value();
  k->a_numel = numel(A.shape);
  k->b_numel = numel(B.shape);
  if (ir::is_float(mm.dtype) && mm.dtype != ir::DType::F32 && mm.dtype != ir::DType::F64)
    b.fail("matmul in " + std::string(ir::dtype_name(mm.dtype)) + " must be legalized to f32 first");
  k->M = A.shape[A.shape.size() - 2];
  k->K = A.shape.back();
  k->N = mm.shape.extents().back();
  const auto out_ext = mm.shape.extents();
  std::vector<i64> ob(out_ext.begin(), out_ext.end() - 2), ab(A.shape.begin(), A.shape.end() - 2),
      bb(B.shape.begin(), B.shape.end() - 2);
  k->a_off = batch_offsets(ab, ob, k->M * k->K);
  k->b_off = batch_offsets(bb, ob, k->K * k->N);
  // A shared B and a contiguous batch of A form one taller GEMM.
  const bool b_shared = std::all_of(k->b_off.begin(), k->b_off.end(), [](i64 v) { return v == 0; });
  bool a_contig = true;
  for (std::size_t i = 0; i < k->a_off.size(); ++i) a_contig = a_contig && k->a_off[i] == i64(i) * k->M * k->K;
  if (k->a_off.size() > 1 && b_shared && a_contig) {
    k->M *= i64(k->a_off.size());
    k->a_off = {0};
    k->b_off = {0};
  }
  k->a_buf = A.id;
  k->b_buf = B.id;

  const auto outs = body.output_ids();
  if (outs.empty() || outs.size() != b.kernel.outputs.size()) b.fail("a matmul kernel needs its outputs");
  const auto& out = b.out(0);
  k->out_buf = out.id;
  // The GEMM writes C straight into the one output when it can; with several
  // outputs C goes to scratch and the epilogue writes them all.
  k->c_in_out = outs.size() == 1 && out.dtype == mm.dtype;
  if (outs.size() > 1 || outs[0] != mm.id) {
    ProgramBuilder eb(body, out.shape);
    b.bind_inputs(eb);
    eb.bind(mm.id, Source{-1, mm.dtype, out_ext});
    for (std::size_t j = 0; j < outs.size(); ++j) {
      if (b.out(j).shape != out.shape) b.fail("matmul epilogue outputs differ in shape");
      eb.store(outs[j], b.out(j).id, b.out(j).dtype, false);
    }
    k->epi = eb.build(b.where() + " epilogue");
  } else if (!k->c_in_out) {
    b.fail("matmul output buffer dtype differs from the matmul");
  }
  const i64 batch = i64(k->a_off.size());
  const double flops = 2.0 * double(batch) * double(k->M) * double(k->N) * double(k->K);
  const auto& b_root = b.lir.buffer(B.root < 0 ? B.id : B.root);
  const bool b_constant = b_root.role == compile::BufferRole::Param || b_root.role == compile::BufferRole::Constant;
  const GemmChoice choice = gemm_override();
  if (k->a_dtype != mm.dtype || k->b_dtype != mm.dtype) {
    build_narrow(b, mm, *k, B, b_constant, b_shared, flops);
    return k;
  }
  const bool f32 = b.packs && mm.dtype == ir::DType::F32 && B.dtype == ir::DType::F32 && k->K > 0;
  const bool pack_once = f32 && b_constant && b_shared && choice != GemmChoice::Blas &&
                         (choice == GemmChoice::Packed || packed_wins(*b.packs->isa, batch * k->M, k->N, k->K));
  const bool pack_run =
      f32 && !pack_once && choice != GemmChoice::Blas &&
      (choice == GemmChoice::Packed || packed_per_run_wins(*b.packs->isa, k->M, k->N, k->K, b_shared ? 1 : batch));
  const bool swapped = f32 && !pack_once && b_trans && choice != GemmChoice::Blas &&
                       std::string_view(b.packs->isa->name) != "generic" && swapped_wins(k->M, k->N, batch);
  if (swapped) {
    const KernelTable& isa = *b.packs->isa;
    k->b_source = MatMulKernel::BSource::Swapped;
    // Units of C^T rows: about 4 per thread, each of at least 48 rows so its transpose writes whole lines of C.
    k->pm = std::clamp<i64>(4 * i64(b.threads), 1, std::max<i64>(k->N / 48, 1));
    if (flops < (1 << 18)) k->pm = 1;
    k->pn = 1;
    if (!k->c_in_out) k->shared_bytes = std::size_t(k->M * k->N) * sizeof(float);
    k->pack_offset = reserve_shared(*k, packed_floats(isa, k->K, k->M) * sizeof(float));
    k->ct_offset = reserve_shared(*k, std::size_t(k->N * k->M) * sizeof(float));
    k->thread_bytes = k->row_bytes() + (k->epi ? k->epi->scratch_bytes : 0);
    return k;
  }
  if (pack_once || pack_run) {
    const KernelTable& isa = *b.packs->isa;
    const i64 panels = (k->N + isa.gemm_nr - 1) / isa.gemm_nr;
    std::tie(k->pm, k->pn) = packed_units(batch, k->M, panels, flops, b.threads);
    plan_whole_rows(*k, batch, b.threads);
    if (pack_once) {
      k->b_source = MatMulKernel::BSource::PackedOnce;
      k->packed = b.packs->request(B.id, k->K, k->N, b_trans);
    } else if (!b_trans && k->N % isa.simd_width == 0 && in_place_wins(k->M)) {
      k->b_source = MatMulKernel::BSource::InPlace;
    } else {
      k->b_source = MatMulKernel::BSource::PackedPerRun;
      k->b_per_batch = !b_shared;
      k->pack_floats = packed_floats(isa, k->K, k->N);
    }
  } else if (flops >= 1 << 18 && b.threads > 1 && batch < b.threads) {
    const i64 per = (b.threads + batch - 1) / batch;
    k->pm = std::clamp<i64>(k->M / 16, 1, per);
    k->pn = std::clamp<i64>(k->N / 64, 1, (per + k->pm - 1) / k->pm);
  }
  if (!k->c_in_out) k->shared_bytes = std::size_t(batch * k->M * k->N) * ir::dtype_size(mm.dtype);
  if (k->b_source == MatMulKernel::BSource::PackedPerRun) {
    k->pack_offset = (k->shared_bytes + 63) / 64 * 64;
    k->shared_bytes = k->pack_offset + k->pack_floats * sizeof(float) * (k->b_per_batch ? std::size_t(batch) : 1);
  }
  k->thread_bytes = k->row_bytes() + (k->epi ? k->epi->scratch_bytes : 0);
  return k;
}

}  // namespace rlx::backends::cpu
