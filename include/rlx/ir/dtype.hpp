#pragma once
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <utility>

namespace rlx::ir {

// Element types, then ggml's block-quantized types (docs/quants.md): a block of
// 32 or 256 consecutive elements along the last axis shares its scales, so an
// element has no size of its own. A block-typed tensor is storage: dequantize,
// quant_matmul and embedding read it, quantize writes it, and every other op
// refuses it (infer names the operand). Then the wider integer types, and
// ONNX's storage-only types (float8, float4, int4, int2), which cast, the
// quantization ops and the movement ops take and every other op refuses. The
// later types come last so that the values of the earlier ones stay as they were.
enum class DType : std::uint8_t {
  F32,
  F16,
  BF16,
  F64,
  I8,
  U8,
  I32,
  I64,
  Bool,
  Q4_0,
  Q4_1,
  Q5_0,
  Q5_1,
  Q8_0,
  Q8_1,
  Q2_K,
  Q3_K,
  Q4_K,
  Q5_K,
  Q6_K,
  Q8_K,
  I16,
  U16,
  U32,
  U64,
  // Storage-only: one element a byte in memory (as ml_dtypes holds them); the 4- and 2-bit types are packed,
  // low bits first, only where a file format packs them (ONNX's TensorProto).
  F8E4M3FN,    // 4 exponent bits, 3 mantissa bits, bias 7, no infinities, NaN S.1111.111
  F8E4M3FNUZ,  // bias 8, no infinities, no -0, NaN 0x80
  F8E5M2,      // IEEE-like: bias 15, infinities and NaNs
  F8E5M2FNUZ,  // bias 16, no infinities, no -0, NaN 0x80
  F8E8M0,      // a power of two 2^(e-127), e in [0, 254]; 0xff is NaN; no sign, no zero
  F4E2M1,      // 2 exponent bits, 1 mantissa bit, bias 1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives
  I4,
  U4,
  I2,
  U2,
};

// The element types ops compute with (the block types are in kBlockDTypes, the storage-only ones in
// kStorageDTypes).
inline constexpr DType kAllDTypes[] = {DType::F32, DType::F16, DType::BF16, DType::F64,  DType::I8,
                                       DType::U8,  DType::I32, DType::I64,  DType::Bool, DType::I16,
                                       DType::U16, DType::U32, DType::U64};
inline constexpr DType kStorageDTypes[] = {DType::F8E4M3FN, DType::F8E4M3FNUZ, DType::F8E5M2, DType::F8E5M2FNUZ,
                                           DType::F8E8M0,   DType::F4E2M1,     DType::I4,     DType::U4,
                                           DType::I2,       DType::U2};
inline constexpr DType kBlockDTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q8_1,
                                         DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_K};

constexpr bool is_block_quantized(DType t) { return t >= DType::Q4_0 && t <= DType::Q8_K; }
// Storage-only element types: cast, the quantization ops and movement read and write them (OpDef::storage_operands).
constexpr bool is_storage_only(DType t) { return t >= DType::F8E4M3FN && t <= DType::U2; }
// The float8 and float4 types among them (their values are floats; they compute as f32 once cast).
constexpr bool is_storage_float(DType t) { return t >= DType::F8E4M3FN && t <= DType::F4E2M1; }

// Elements per block and bytes per block: ggml's block structs (ggml-common.h; rlx/ir/quants.hpp
// checks its structs against these), and 1 and the element's size for the element types.
struct BlockLayout {
  std::size_t elems, bytes;
};
constexpr BlockLayout block_layout(DType t) {
  switch (t) {
    case DType::F64:
    case DType::I64: return {1, 8};
    case DType::F32:
    case DType::I32: return {1, 4};
    case DType::F16:
    case DType::BF16: return {1, 2};
    case DType::I8:
    case DType::U8:
    case DType::Bool: return {1, 1};
    case DType::U64: return {1, 8};
    case DType::U32: return {1, 4};
    case DType::I16:
    case DType::U16: return {1, 2};
    case DType::F8E4M3FN:
    case DType::F8E4M3FNUZ:
    case DType::F8E5M2:
    case DType::F8E5M2FNUZ:
    case DType::F8E8M0:
    case DType::F4E2M1:
    case DType::I4:
    case DType::U4:
    case DType::I2:
    case DType::U2: return {1, 1};
    case DType::Q4_0: return {32, 18};
    case DType::Q4_1: return {32, 20};
    case DType::Q5_0: return {32, 22};
    case DType::Q5_1: return {32, 24};
    case DType::Q8_0: return {32, 34};
    case DType::Q8_1: return {32, 36};
    case DType::Q2_K: return {256, 84};
    case DType::Q3_K: return {256, 110};
    case DType::Q4_K: return {256, 144};
    case DType::Q5_K: return {256, 176};
    case DType::Q6_K: return {256, 210};
    case DType::Q8_K: return {256, 292};
  }
  return {1, 0};
}
constexpr std::size_t block_elems(DType t) { return block_layout(t).elems; }
constexpr std::size_t block_bytes(DType t) { return block_layout(t).bytes; }
// Bytes per element on average (a block type's share of its block), for cost estimates.
constexpr double element_bytes(DType t) { return double(block_bytes(t)) / double(block_elems(t)); }
// The bytes of an element type's element; rlx::Error for a block type (use storage_bytes).
std::size_t dtype_size(DType t);
// The bytes of a tensor of `shape`: numel * dtype_size, or for a block type one block per
// block_elems(t) elements of each row (the last axis). rlx::Error, naming the shape, when a block
// type's last extent is not a positive multiple of its block, or the shape is a scalar.
std::size_t storage_bytes(DType t, std::span<const std::int64_t> shape);
std::string_view dtype_name(DType t);   // "f32", "f16", ...
DType parse_dtype(std::string_view s);  // throws rlx::Error naming the bad string
bool is_float(DType t);                 // f32 f16 bf16 f64 (not the block or storage-only types)
bool is_integer(DType t);               // i8 u8 i16 u16 i32 u32 i64 u64 (not bool, not i4/u4/i2/u2)
bool is_signed(DType t);                // the floats (storage-only ones included), i8 i16 i32 i64 i4 i2
bool is_unsigned(DType t);              // u8 u16 u32 u64 u4 u2
// The range of an integer type (i4/u4/i2/u2 included), as doubles: [-2^63, 2^64) for i64 and u64.
std::pair<double, double> integer_range(DType t);

// IEEE half and bfloat16 conversion, round to nearest even. Shared by every
// backend and the reference so they round identically.
inline float bf16_to_float(std::uint16_t h) {
  std::uint32_t bits = std::uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return std::uint16_t(bits >> 16);
}
float half_to_float(std::uint16_t h);
std::uint16_t float_to_half(float f);

// How a cast rounds into a storage-only float type (ONNX's Cast attributes): float8 saturates to its
// largest finite value when `saturate` (else overflow is inf or NaN, as the type has them); float8e8m0
// rounds up, down or to nearest.
enum class E8M0Round : std::uint8_t { Up, Down, Nearest };
struct CastMode {
  bool saturate = true;
  E8M0Round round = E8M0Round::Up;
};
// The round mode named by ONNX's `round_mode` ("up", "down", "nearest"); rlx::Error naming it otherwise.
E8M0Round parse_e8m0_round(std::string_view s);

// Rounds a double to what storing it in `t` and reading it back yields
// (float rounding, integer truncation with wrap-around, bool as 0/1). For the
// storage-only floats this is the non-saturating rounding: it keeps what a
// cast produced (a saturated value, an inf or a NaN) as it is.
double round_to_dtype(double v, DType t);
// The cast's rounding into `t`: round_to_dtype but with `mode` for the storage-only floats.
double round_to_dtype(double v, DType t, CastMode mode);
// The byte of a storage-only type holding round_to_dtype(v, t) (a 4- or 2-bit type in its low bits), and
// the value a byte holds (only its low 4 or 2 bits are read for the sub-byte types).
std::uint8_t storage_encode(DType t, double v);
double storage_decode(DType t, std::uint8_t bits);

}  // namespace rlx::ir
