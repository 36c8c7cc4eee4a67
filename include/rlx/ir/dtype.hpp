#pragma once
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace rlx::ir {

// Element types, then ggml's block-quantized types (docs/quants.md): a block of
// 32 or 256 consecutive elements along the last axis shares its scales, so an
// element has no size of its own. A block-typed tensor is storage: dequantize,
// quant_matmul and embedding read it, quantize writes it, and every other op
// refuses it (infer names the operand).
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
};

// The element types (the block types are in kBlockDTypes).
inline constexpr DType kAllDTypes[] = {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I8,
                                       DType::U8,  DType::I32, DType::I64,  DType::Bool};
inline constexpr DType kBlockDTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q8_1,
                                         DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_K};

constexpr bool is_block_quantized(DType t) { return t >= DType::Q4_0; }

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
bool is_float(DType t);                 // f32 f16 bf16 f64 (not the block types)
bool is_integer(DType t);               // i8 u8 i32 i64 (not bool)
bool is_signed(DType t);

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

// Rounds a double to what storing it in `t` and reading it back yields
// (float rounding, integer truncation with wrap-around, bool as 0/1).
double round_to_dtype(double v, DType t);

}  // namespace rlx::ir
