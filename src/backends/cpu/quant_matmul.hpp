#pragma once
// Matrix-vector and matrix-matrix products with a weight in ggml's block formats (issue 14, part 3).
// The weight stays in its blocks: W is row-major [rows, cols], each row a run of cols / block blocks
// along k, as a GGUF file stores a linear layer's [out, in] weight.
//
// Two modes:
//   Fast:  llama.cpp's scheme. Each activation row is quantized per block (QuantAct below), and each
//          weight block meets it in an integer dot product (AVX-512 VNNI vpdpbusd, AVX2 vpmaddubsw,
//          or scalar) with the scales applied in f32.
//   Exact: f32 activations; each weight row is dequantized exactly (rlx::ir::dequantize) into an
//          L1-resident buffer and dotted in f32. For checking; it takes every type rlx::ir::dequantize takes.
//
// The per-ISA kernels live in isa/quant_impl.inc, compiled once per ISA (generic, avx2, avx512vnni)
// and picked at run time by cpuid; only the plain QuantTable crosses that boundary (see isa.hpp).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/ir/dtype.hpp"

namespace rlx::backends::cpu {

enum class QuantMode : std::uint8_t { Fast, Exact };

// The activation side of a fast dot product. The 32-element types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
// take Q8_0's quants with an f32 scale and the block's exact integer sum: the sum carries Q4_0's
// and Q5_0's offsets (-8, -16) and Q4_1's and Q5_1's mins. That is ggml's Q8_1 without the f16
// rounding of its `s` (d * sum) and of `d`. The K-quants take ggml's Q8_K (ir::BlockQ8_K)
// exactly as rlx::ir::quantize makes it (its bsums carry the mins and Q6_K's offset of -32).
struct ActQ8 {
  float d;             // x ~= d * q
  std::int32_t sum;    // sum of qs
  std::int8_t qs[32];  // round-to-nearest-even(x / d), |q| <= 127
};
static_assert(sizeof(ActQ8) == 40);

// Whether the fast mode has an integer kernel for t (otherwise quant_* throws naming the type).
bool quant_fast_supported(ir::DType t);
// Whether the exact mode takes t: every type rlx::ir::dequantize takes.
bool quant_exact_supported(ir::DType t);
// The activation format of t's fast kernel: Q8_0 (for ActQ8) or Q8_K.
ir::DType quant_act_type(ir::DType t);
// Bytes of one quantized activation row of `cols` for weight type t.
std::size_t quant_act_bytes(ir::DType t, std::int64_t cols);

// y[r] = sum_k W[r, k] * x[k] for r < rows. w holds rows * cols / block blocks. Throws rlx::Error,
// naming the type, when the mode does not take t, and when cols is not a positive multiple of
// the block or rows is not positive.
void quant_gemv(ir::DType t, const std::byte* w, std::int64_t rows, std::int64_t cols, const float* x, float* y,
                QuantMode mode = QuantMode::Fast);
// Prefill: y[j, r] = sum_k W[r, k] * x[j, k] for j < n (x [n, cols], y [n, rows], both row-major).
void quant_gemm(ir::DType t, const std::byte* w, std::int64_t rows, std::int64_t cols, const float* x, std::int64_t n,
                float* y, QuantMode mode = QuantMode::Fast);

// ---- the per-ISA boundary (tests and benchmarks pick an ISA explicitly) -------------------------

struct QuantTable {
  const char* name;
  // Quantizes one activation row of `cols` floats to `act` (Q8_0: ActQ8 blocks, Q8_K: BlockQ8_K).
  void (*quantize_act)(ir::DType act, const float* x, std::int64_t cols, std::byte* out);
  // Fast products of weight rows [r0, r1) with n quantized activation rows:
  // y[j * ldy + r] = dot(row r of w, activation j). Rows of w are row_bytes apart, activation rows
  // act_bytes apart; nb is the number of blocks in a row. scratch holds scratch_bytes(t, cols, n)
  // bytes for this call alone (null when that is 0). Returns false when t has no kernel.
  bool (*dot_rows)(ir::DType t, const std::byte* w, std::int64_t row_bytes, std::int64_t r0, std::int64_t r1,
                   std::int64_t nb, const std::byte* act, std::int64_t act_bytes, std::int64_t n, float* y,
                   std::int64_t ldy, std::byte* scratch);
  // sum_k a[k] * b[k] in f32 (the exact mode's inner product).
  float (*dot_f32)(const float* a, const float* b, std::int64_t n);
  // The scratch dot_rows wants for n activation rows of cols (0: none). The AVX-512 VNNI table unpacks
  // sixteen weight rows at a time into it (a panel) when n is large enough to pay for that.
  std::int64_t (*scratch_bytes)(ir::DType t, std::int64_t cols, std::int64_t n);
};

namespace generic {
const QuantTable& quant_table();
}
namespace avx2 {
const QuantTable& quant_table();
}
namespace avx512vnni {
const QuantTable& quant_table();
}

// The quant ISAs this CPU runs, best first ("avx512vnni", "avx2", "generic").
std::vector<std::string> quant_isas();
// The table for one of quant_isas(); rlx::Error when unknown or not supported here.
const QuantTable& quant_table(std::string_view isa);
// The default: the best supported, or RLX_CPU_ISA's choice (avx512 means avx512vnni where the CPU
// has VNNI, else avx2).
const QuantTable& select_quant_table();

// quant_gemv / quant_gemm on an explicit table, on at most max_threads threads of the pool (0: all).
void quant_gemm_with(const QuantTable& table, ir::DType t, const std::byte* w, std::int64_t rows, std::int64_t cols,
                     const float* x, std::int64_t n, float* y, QuantMode mode, int max_threads = 0);
// Quantizes n activation rows as the fast mode does (quant_act_bytes(t, cols) bytes each), for tests.
void quant_activations_with(const QuantTable& table, ir::DType t, const float* x, std::int64_t cols, std::int64_t n,
                            std::byte* out, int max_threads = 0);

}  // namespace rlx::backends::cpu
