#pragma once
// The boundary between the ISA-neutral CPU backend and its per-ISA hot loops
// (isa/kernels_impl.inc, compiled once per ISA with that ISA's -m flags).
// Only plain structs and raw pointers cross it: an inline function or
// template instantiated in the AVX-512 translation unit could otherwise be
// the copy the linker keeps for every caller, and crash a CPU without AVX-512.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/ir/dtype.hpp"

namespace rlx::backends::cpu {

// Elements per elementwise block: the registers of a program stay in L1.
inline constexpr std::int64_t kBlock = 1024;
inline constexpr int kMaxRank = 16;

// Compute types: f32 for f32/f16/bf16 and the storage-only floats, f64, i32 for i32/i16/u16/i8/u8/bool and
// i4/u4/i2/u2, i64 for i64/u32, u64 for u64 (whose division, comparisons and conversions i64 would get wrong
// past 2^63).
enum class CT : std::uint8_t { F32, F64, I32, I64, U64 };

// clang-format off
enum class Op : std::uint8_t {
  // unary (a -> dst)
  Neg, Abs, Exp, Log, Sqrt, Rsqrt, Recip, Tanh, Sigmoid, Relu, Gelu, GeluTanh, Silu, Softplus, Erf, Sin, Cos,
  Floor, Ceil, Round, Sign, Not,
  // binary (a, b -> dst); comparisons write i32 0/1
  Add, Sub, Mul, Div, Pow, Max, Min, Mod, Eq, Ne, Lt, Le, Gt, Ge, And, Or,
  Where,   // dst = a (i32 cond) ? b : c, in ct
  Clamp,   // dst = clamp(a, f0, f1) with NaN kept
  Cast,    // dst (ct2) = a (ct) converted like a store to `dtype` (bool: a != 0)
  Narrow,  // dst = a rounded to `dtype` (f16, bf16, storage floats within f32, i0 the CastMode; narrower ints)
  Fill,    // dst = constant (f0 for floats, i0 for ints)
  Load,    // dst = loads[io] at the block's indices
  Store,   // stores[io] at the block's indices = a
  Fused,   // micros[io, io + i0): a run of f32 instructions evaluated tile by tile (see Micro)
};
// clang-format on

// A fused run keeps one running value, `acc`, in vector registers for a tile
// of a few vectors and applies its steps to that tile before moving to the
// next, so a value that only feeds the next step never goes through memory.
// Each step is one Micro, dispatched once per tile on `code`:
namespace micro {
inline constexpr std::uint8_t kLoadStream = 0;   // acc = slot, at the tile's offset
inline constexpr std::uint8_t kLoadUniform = 1;  // acc = element 0 of slot
inline constexpr std::uint8_t kSave = 2;         // slot = acc
inline constexpr std::uint8_t kStore = 3;        // stores[io] = acc (f32 storage)
inline constexpr std::uint8_t kClamp = 4;        // acc = clamp(acc, f0, f1)
inline constexpr std::uint8_t kUnary = 8;        // + op (Neg .. Sign): acc = op(acc)
// + 5 * (op - Add) + form (Add .. Mod): acc = op(acc, y) for forms 0 (y = acc),
// 1 (y = slot streamed), 2 (y = uniform slot), and op(y, acc) for forms 3
// (streamed) and 4 (uniform).
inline constexpr std::uint8_t kBinary = 32;
}  // namespace micro

struct Micro {
  std::uint8_t code = 0;
  std::int16_t slot = -1;
  std::int32_t io = -1;
  float f0 = 0, f1 = 0;
};

enum class LoadKind : std::uint8_t {
  Contig,   // element f of the iteration is element f of the source
  Scalar,   // one element broadcast
  Row,      // element f is element f % period (broadcast along leading dims)
  Strided,  // general: collapsed extents and element strides (0 = broadcast)
};

struct LoadSpec {
  const std::byte* fixed = nullptr;  // constant data; otherwise resolved through `buffer`
  std::int32_t buffer = 0;           // >= 0: ptrs[buffer]; < 0: aux[-1 - buffer]
  ir::DType dtype = ir::DType::F32;  // storage dtype
  LoadKind kind = LoadKind::Contig;
  std::int32_t rank = 0;
  std::int64_t period = 0;
  std::int64_t ext[kMaxRank] = {};
  std::int64_t stride[kMaxRank] = {};
};

struct StoreSpec {
  std::int32_t buffer = 0;  // as LoadSpec::buffer
  ir::DType dtype = ir::DType::F32;
  bool stream = false;  // non-temporal stores: the output is larger than the caches
};

struct Instr {
  Op op = Op::Fill;
  CT ct = CT::F32;   // operand compute type
  CT ct2 = CT::F32;  // Cast: result compute type
  ir::DType dtype = ir::DType::F32;
  std::int16_t dst = -1, a = -1, b = -1, c = -1;  // value slots
  std::int32_t io = -1;                           // Load / Store index
  double f0 = 0, f1 = 0;
  std::int64_t i0 = 0;
  // Bit k set: operand k (a, b, c) is uniform, one value broadcast over the
  // block, so it is read once instead of streamed (only element 0 is used).
  std::uint8_t uniform = 0;
};

// A compiled elementwise program. Slots [0, n_regs) are registers of kBlock
// elements in per-thread scratch; slot n_regs + k reads loads[direct[k]] in
// place (contiguous, no conversion). `init` runs once per task over a whole
// block (constants, scalar loads, values that depend only on them).
struct Program {
  const Instr* init = nullptr;
  std::int32_t n_init = 0;
  const Instr* code = nullptr;
  std::int32_t n_code = 0;
  const LoadSpec* loads = nullptr;
  const StoreSpec* stores = nullptr;
  const std::int32_t* direct = nullptr;
  const Micro* micros = nullptr;  // steps of the Fused instructions
  std::int32_t n_direct = 0;
  std::int32_t n_regs = 0;
  std::int64_t reg_bytes = 0;  // distance between registers
  std::int32_t result = -1;    // slot returned by ew_block (reduce prologues)
  bool streams = false;
};

struct EwCtx {
  std::byte* const* ptrs = nullptr;  // the executable's buffer pointer table
  std::byte* const* aux = nullptr;   // kernel-local sources (a reduce's result, a matmul's tile)
  std::byte* scratch = nullptr;      // this thread's scratch, program_scratch_bytes() large
};

// ---- reductions ------------------------------------------------------------
enum class RedOp : std::uint8_t { Sum, Mean, Max, Min, Prod, ArgMax, ArgMin };

// The reduce input is viewed as [outer, red, inner] (the prologue's
// iteration order makes it so). Work is split into units:
//   inner == 1: unit = (o, s); inner > 1: unit = ((o, chunk), s)
// where s < splits cuts the reduced range; with splits > 1 each unit writes a
// partial Acc and reduce_combine merges them.
struct ReducePlan {
  RedOp op = RedOp::Sum;
  CT ct = CT::F32;      // compute type of the reduced values
  CT out_ct = CT::F32;  // compute type of the result (i64 for arg reductions)
  std::int64_t outer = 1, red = 1, inner = 1;
  std::int64_t splits = 1;
  std::int64_t chunk = 1, chunks = 1;  // inner > 1: inner elements per unit
  const Program* pro = nullptr;        // its `result` slot yields the values
};

struct Acc {
  union {
    double f;
    std::int64_t i;
  } v;
  std::int64_t idx;
};

struct ReduceCtx {
  EwCtx pro;                 // prologue context (its scratch is per thread)
  std::byte* acc = nullptr;  // per thread: 16 * chunk bytes of row accumulators
  Acc* partial = nullptr;    // splits > 1: [splits][outer * inner]
  std::byte* out = nullptr;  // results, one out_ct value per output element
};

// A convolution for the direct kernel (isa/conv_impl.inc), whose layouts block channels by
// KernelTable::conv_block (B, the vector width):
// - input, written by conv_block_input: [N][G][Cg/B][Hp][Wp][B], zero in the padding;
// - weights, written by conv_pack_weights: [G][Og/B][Cg/B][KH][KW][B ci][B co];
// - output: NCHW, y[n][g * Og + o][oh][ow], written straight from the registers.
// A 1x1 stride-1 unpadded conv arrives as one row of H * W positions (H = 1).
struct ConvGeom {
  std::int64_t N = 1, G = 1, Cg = 1, Og = 1;    // batch, groups, channels in and out per group
  std::int64_t H = 1, Wd = 1, Hp = 1, Wp = 1;   // input rows and columns, unpadded and padded
  std::int64_t OH = 1, OW = 1, KH = 1, KW = 1;  // output and kernel extents
  std::int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  std::int64_t block = 1;   // B
  std::int64_t nb = 1;      // output-channel blocks per register tile: 1, 2 or 4
  std::int64_t strips = 1;  // register tiles per output row (positions split evenly)
  // Winograd: floats between its 16 transformed-input (v) and product (m) matrices.
  std::int64_t v_stride = 0, m_stride = 0;
  // conv_direct's work units: (image, group, run of nb output-channel blocks, output row, strip).
  std::int64_t units() const { return N * G * (Og / block / nb) * OH * strips; }
};

// ---- the per-ISA function table ----------------------------------------------
struct KernelTable {
  const char* name;
  // Evaluates iteration indices [begin, end) block by block (stores included).
  void (*ew_run)(const Program&, const EwCtx&, std::int64_t begin, std::int64_t end);
  void (*reduce_units)(const ReducePlan&, const ReduceCtx&, std::int64_t u0, std::int64_t u1);
  // Merges the partials of outputs [o0, o1) (splits > 1).
  void (*reduce_combine)(const ReducePlan&, const ReduceCtx&, std::int64_t o0, std::int64_t o1);
  // Softmax / log-softmax of `rows` contiguous rows of n.
  void (*softmax_rows)(const float* x, float* y, std::int64_t rows, std::int64_t n, bool log);
  // Softmax along the middle axis of columns [0, width) of one [n, inner] slice.
  void (*softmax_cols)(const float* x, float* y, std::int64_t n, std::int64_t inner, std::int64_t width, bool log);
  // Layer norm (or RMS norm) of `rows` rows of n; gamma/beta may be null.
  void (*norm_rows)(const float* x, float* y, const float* gamma, const float* beta, std::int64_t rows, std::int64_t n,
                    float eps, bool rms);
  // dst[c * dst_stride + r] = src[r * src_stride + c] for 4-byte elements.
  void (*transpose32)(const std::uint32_t* src, std::int64_t src_stride, std::uint32_t* dst, std::int64_t dst_stride,
                      std::int64_t rows, std::int64_t cols);
  // Packed-B f32 GEMM (isa/gemm_impl.inc). A constant B [K, N] is packed once
  // into panels of gemm_nr columns: panel p holds B[k, p * gemm_nr + j] at
  // (p * K + k) * gemm_nr + j, zero past N (ceil(N / gemm_nr) * gemm_nr * K floats).
  std::int32_t gemm_nr;
  // Packs panels [p0, p1) of b (rows ldb floats apart).
  void (*gemm_pack_b)(const float* b, std::int64_t ldb, std::int64_t K, std::int64_t N, float* packed, std::int64_t p0,
                      std::int64_t p1);
  // The same panels from B^T [N, K] (rows ldbt floats apart).
  void (*gemm_pack_bt)(const float* bt, std::int64_t ldbt, std::int64_t K, std::int64_t N, float* packed,
                       std::int64_t p0, std::int64_t p1);
  // c[m, n] = sum_k a[m, k] * B[k, n] for rows [m0, m1) and the columns of
  // panels [p0, p1) below N; a and c are the matrices' origins. B[k, p * gemm_nr + j]
  // is at b[p * panel_stride + k * ldb + j]: packed panels (ldb = gemm_nr,
  // panel_stride = K * gemm_nr) or B read in place (ldb = N, panel_stride =
  // gemm_nr; then every panel's columns must lie inside B: N % vector width == 0).
  void (*gemm_packed)(const float* a, std::int64_t lda, const float* b, std::int64_t ldb, std::int64_t panel_stride,
                      std::int64_t K, std::int64_t N, float* c, std::int64_t ldc, std::int64_t m0, std::int64_t m1,
                      std::int64_t p0, std::int64_t p1);
  std::int32_t simd_width;  // floats per vector: B in place needs N % simd_width == 0
  // The direct convolution (isa/conv_impl.inc, layouts at ConvGeom); conv_block is 0 where the ISA has none.
  std::int32_t conv_block;
  std::int32_t conv_accumulators;  // vector registers a tile may hold: nb * positions <= this
  // Units [u0, u1) of (group, output-channel block): w is [G * Og, Cg, KH, KW].
  void (*conv_pack_weights)(const float* w, std::int64_t G, std::int64_t Og, std::int64_t Cg, std::int64_t taps,
                            float* out, std::int64_t u0, std::int64_t u1);
  // Units [u0, u1) of (image, group, input-channel block): x is NCHW.
  void (*conv_block_input)(const ConvGeom& g, const float* x, float* xb, std::int64_t u0, std::int64_t u1);
  // Units [u0, u1) of ConvGeom::units(); bias may be null.
  void (*conv_direct)(const ConvGeom& g, const float* xb, const float* wk, const float* bias, float* y, std::int64_t u0,
                      std::int64_t u1);
  // Winograd F(2x2, 3x3) for a 3x3 stride-1 undilated conv of one group (isa/conv_impl.inc). Its T =
  // N * ceil(OH / 2) * ceil(OW / 2) tiles of 2 x 2 outputs read 4 x 4 inputs of the blocked input, whose padding
  // reaches 2 * ceil(OH / 2) + 2 rows and 2 * ceil(OW / 2) + 2 columns. The transformed input v is 16 [T, Cg]
  // matrices v_stride floats apart, and the products m 16 [T, Og] matrices m_stride apart: 16 GEMMs with the
  // transformed weights between them.
  // wino_input: units (image, input-channel block); wino_output: units (image, output-channel block).
  void (*wino_input)(const ConvGeom& g, const float* xb, float* v, std::int64_t u0, std::int64_t u1);
  void (*wino_output)(const ConvGeom& g, const float* m, const float* bias, float* y, std::int64_t u0, std::int64_t u1);
};

namespace generic {
const KernelTable& table();
}
namespace avx2 {
const KernelTable& table();
}
namespace avx512 {
const KernelTable& table();
}

// ISAs this CPU can run, best first.
std::vector<std::string> supported_isas();
// The table for `isa` ("generic", "avx2", "avx512"); throws rlx::Error when
// unknown or not supported by this CPU.
const KernelTable& kernel_table(std::string_view isa);
// The table compile_lir uses: RLX_CPU_ISA when set, else the best supported.
const KernelTable& select_kernels();

}  // namespace rlx::backends::cpu
