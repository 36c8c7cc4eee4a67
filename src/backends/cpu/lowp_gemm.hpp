#pragma once
// Low-precision GEMMs: the products a matmul computes on operands that a widening cast brought up from a
// narrower type (lower.cpp absorbs those casts into the matmul kernel, BackendTraits::matmul_widened_operands):
//   int8: i32 C = A (u8 or i8) x B (u8 or i8), exactly, with AMX-INT8's TDPBUSD/TDPBSSD where the CPU and the
//         kernel allow AMX, else AVX-512 VNNI's vpdpbusd, else AVX2's vpmaddwd on operands widened to s16 (B's
//         panels hold s16 pairs there: i8_b_bytes 2, no offsets, the colsum part zero);
//   bf16: f32 C = A (bf16) x B (bf16), accumulated in f32, with AMX's TDPBF16PS where the CPU and the kernel
//         allow AMX, else AVX512-BF16's vdpbf16ps (or, without it, the exact bf16 -> f32 widening and FMA).
// A is read in place; B is packed (once when it is a weight, per run otherwise) into panels of `nr` columns:
//   int8: vpdpbusd multiplies unsigned by signed bytes, so B is stored signed (a u8 B as b - 128) and A is fed
//         unsigned (an i8 A as a + 128); the offsets come back out exactly at the store:
//           A.B = A'.B' + b_off * rowsum(A') - a_off * colsum(B') - a_off * b_off * K
//         with a_off, b_off 128 or 0 (AMX has a signed-by-signed product too, so there a_off is 0). Panel p
//         holds, for each quad q of k, B'[4q + t, p * nr + j] at byte (q * nr + j) * 4 + t (zero past K, up to
//         a multiple of i8_k_align, and past N), then colsum(B') of its nr columns as i32: the quads are AMX's
//         4-byte-interleaved B layout, so its tiles load them in place.
//   bf16: panel p holds, for each pair q of k, B[2q + t, p * nr + j] at element (q * nr + j) * 2 + t, with k
//         zero-padded to a multiple of bf16_k_align (AMX's tiles take 32 values of k at a time).
// Per-ISA code in isa/lowp_impl.inc; only this plain table crosses that boundary (see isa.hpp).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rlx::backends::cpu {

// The int8 GEMM's fused store (lowp_chain.hpp): y = steps(f32(acc)) per element of column n (or steps(x) of
// an f32 input x: a standalone quantize), each step on f32
// with the generic epilogue program's semantics (elementwise_impl.inc), then y stored as f32, or truncated to
// i32 and its low byte stored (u8 or i8), as the program's cast and narrowing do.
struct I8EpiStep {
  enum Kind : std::uint8_t { Add, Sub, RSub, Mul, Div, Max, Min, Relu, Round, Clamp };
  Kind kind = Add;
  const float* col = nullptr;   // the operand per column (col[n]); null: the scalar `k`
  float k = 0, lo = 0, hi = 0;  // Clamp's bounds in lo and hi
};
struct I8Epilogue {
  const I8EpiStep* steps = nullptr;
  int n_steps = 0;
  bool f32_in = false;  // the input is f32 (a standalone quantize), not the i32 accumulator
  enum Out : std::uint8_t { F32, U8, I8 } out = F32;
  std::byte* dst = nullptr;  // element [m, n] at dst + (m * ldd + n) * the output's size
  std::int64_t ldd = 0;
};

struct LowpTable {
  const char* name;
  // int8 (nr 0: no kernel, the matmul widens its operands and runs the integer loop).
  std::int32_t i8_nr;
  std::int32_t i8_k_align;  // K rounded up to a multiple of this in the panels (AMX's tiles take 64 at a time)
  std::int32_t i8_b_bytes;  // bytes a packed value of B takes: 1, or 2 where the kernel reads B as s16 (AVX2)
  // Packs panels [p0, p1) of B [K, N] (rows ldb bytes apart), or of B^T [N, K] (rows ldb bytes apart) when
  // `transposed`; `b_unsigned`: B holds u8.
  void (*i8_pack_b)(const std::uint8_t* b, bool b_unsigned, bool transposed, std::int64_t ldb, std::int64_t K,
                    std::int64_t N, std::byte* packed, std::int64_t p0, std::int64_t p1);
  // c[m, n] = sum_k A[m, k] * B[k, n] for rows [m0, m1) and the columns of panels [p0, p1) below N.
  // `rowsum` has room for m1 - m0 values (used when b_unsigned).
  void (*i8_gemm)(const std::uint8_t* a, bool a_unsigned, std::int64_t lda, const std::byte* packed, bool b_unsigned,
                  std::int64_t K, std::int64_t N, std::int32_t* c, std::int64_t ldc, std::int64_t m0, std::int64_t m1,
                  std::int64_t p0, std::int64_t p1, std::int32_t* rowsum);
  // i8_gemm with `epi` applied to each tile as it leaves the registers, into epi's dst (C's rows and columns); C
  // is not written. Null where the table has none; false, with nothing done, where it cannot (K past a slice).
  bool (*i8_gemm_fused)(const std::uint8_t* a, bool a_unsigned, std::int64_t lda, const std::byte* packed,
                        bool b_unsigned, std::int64_t K, std::int64_t N, std::int64_t m0, std::int64_t m1,
                        std::int64_t p0, std::int64_t p1, std::int32_t* rowsum, const I8Epilogue& epi);
  // Rows [m0, m1) x columns [n0, n1) of C (i32, or f32 when epi.f32_in; rows ldc elements apart) through `epi`
  // into its dst (same row and column indices).
  void (*i8_epilogue)(const void* c, std::int64_t ldc, std::int64_t m0, std::int64_t m1, std::int64_t n0,
                      std::int64_t n1, const I8Epilogue& epi);
  // bf16 (nr 0: no kernel).
  std::int32_t bf16_nr;
  std::int32_t bf16_k_align;
  void (*bf16_pack_b)(const std::uint16_t* b, bool transposed, std::int64_t ldb, std::int64_t K, std::int64_t N,
                      std::byte* packed, std::int64_t p0, std::int64_t p1);
  void (*bf16_gemm)(const std::uint16_t* a, std::int64_t lda, const std::byte* packed, std::int64_t K, std::int64_t N,
                    float* c, std::int64_t ldc, std::int64_t m0, std::int64_t m1, std::int64_t p0, std::int64_t p1);
  // The bf16 GEMM's peak is well above the f32 GEMM's (AMX), so casting f32 products to bf16 pays
  // (BackendTraits::fast_low_precision); vdpbf16ps's equals two FMAs, so it does not.
  bool bf16_beats_f32;
  // The smallest int8 matmul (multiply-adds, and output columns) at which PTQ's int8 form beats f32 end to
  // end, input quantization included (BackendTraits::int8_matmul_min_macs and _min_n; measured per table,
  // docs/precision.md).
  std::int64_t i8_min_macs;
  std::int64_t i8_min_n;
  std::int64_t i8_min_row_macs;  // BackendTraits::int8_matmul_min_row_macs: the least K·N
};

// Bytes of one packed panel and of a whole packed B.
inline std::size_t i8_panel_bytes(std::int32_t nr, std::int64_t K, std::int32_t k_align, std::int32_t b_bytes = 1) {
  return std::size_t((K + k_align - 1) / k_align * k_align * nr * b_bytes + nr * 4);
}
inline std::size_t i8_panel_bytes(const LowpTable& t, std::int64_t K) {
  return i8_panel_bytes(t.i8_nr, K, t.i8_k_align, t.i8_b_bytes);
}
inline std::size_t bf16_panel_bytes(std::int32_t nr, std::int64_t K, std::int32_t k_align) {
  return std::size_t((K + k_align - 1) / k_align * k_align / 2 * nr * 4);
}
inline std::size_t lowp_panels(std::int32_t nr, std::int64_t N) { return std::size_t((N + nr - 1) / nr); }

namespace generic {
const LowpTable& lowp_table();
}
namespace avx2 {
const LowpTable& lowp_table();
}
namespace avx512lowp {
const LowpTable& lowp_table();
}
namespace avx512amx {
const LowpTable& lowp_table();
}

// The low-precision ISAs this CPU runs, best first ("avx512amx": avx512lowp with AMX tiles for bf16 and int8,
// where the CPU has AMX-BF16 and AMX-INT8 and the kernel grants the process AMX's state; "avx512lowp": AVX-512 with
// VNNI and BF16; "avx2": bf16 by widening, int8 on vpmaddwd; "generic": neither).
std::vector<std::string> lowp_isas();
// The table for one of lowp_isas(); rlx::Error when unknown or not supported here.
const LowpTable& lowp_table(std::string_view isa);
// The default: the best supported, or RLX_CPU_ISA's choice (avx512 means avx512lowp where the CPU has VNNI
// and BF16, else avx2).
const LowpTable& select_lowp_table();
// Whether `table`'s bf16 GEMM beats the f32 GEMM on this CPU, so that auto-mixed precision may use it
// (BackendTraits::fast_low_precision): AMX's always; vdpbf16ps's on AMD's cores, which issue it at the FMA's rate
// with two products a lane (Zen 4: gemm_lowp_1024^3 at 2.06x f32), not on Intel's before AMX, which issue it at
// half that rate (0.70x, docs/precision.md).
bool bf16_beats_f32(const LowpTable& table);

}  // namespace rlx::backends::cpu
