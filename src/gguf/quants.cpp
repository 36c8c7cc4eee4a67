#include "rlx/gguf/quants.hpp"

#include <string>

#include "rlx/error.hpp"
#include "rlx/ir/quants.hpp"

namespace rlx::gguf {

namespace {

using ir::DType;

// ggml's types and the dtypes that hold the same bytes.
constexpr std::pair<GgmlType, DType> kSame[] = {
    {GgmlType::F32, DType::F32},   {GgmlType::F16, DType::F16},   {GgmlType::BF16, DType::BF16},
    {GgmlType::Q4_0, DType::Q4_0}, {GgmlType::Q4_1, DType::Q4_1}, {GgmlType::Q5_0, DType::Q5_0},
    {GgmlType::Q5_1, DType::Q5_1}, {GgmlType::Q8_0, DType::Q8_0}, {GgmlType::Q8_1, DType::Q8_1},
    {GgmlType::Q2_K, DType::Q2_K}, {GgmlType::Q3_K, DType::Q3_K}, {GgmlType::Q4_K, DType::Q4_K},
    {GgmlType::Q5_K, DType::Q5_K}, {GgmlType::Q6_K, DType::Q6_K}, {GgmlType::Q8_K, DType::Q8_K},
};

std::string type_name(GgmlType t) {
  if (auto info = ggml_type_info(static_cast<std::uint32_t>(t))) return std::string(info->name);
  return "type " + std::to_string(static_cast<std::uint32_t>(t));
}

DType codec_dtype(GgmlType t, const char* what) {
  if (auto d = to_dtype(t)) return *d;
  throw Error(std::string(what) + " " + type_name(t) +
              " is not supported (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, "
              "Q5_K, Q6_K, Q8_K)");
}

}  // namespace

std::optional<DType> to_dtype(GgmlType t) {
  for (const auto& [g, d] : kSame)
    if (g == t) return d;
  return std::nullopt;
}

GgmlType to_ggml(DType t) {
  for (const auto& [g, d] : kSame)
    if (d == t) return g;
  throw Error("dtype " + std::string(ir::dtype_name(t)) + " has no GGUF tensor type here (f32, f16, bf16 and the " +
              "block types have)");
}

bool can_dequantize(GgmlType t) { return to_dtype(t).has_value(); }
bool can_quantize(GgmlType t) { return to_dtype(t).has_value(); }

std::size_t quantized_bytes(GgmlType t, std::size_t n) {
  const auto info = ggml_type_info(static_cast<std::uint32_t>(t));
  if (!info) throw Error("unknown ggml type " + std::to_string(static_cast<std::uint32_t>(t)));
  if (n % info->block_elems != 0)
    throw Error("elements of " + type_name(t) + ": " + std::to_string(n) +
                " elements is not a multiple of its block of " + std::to_string(info->block_elems));
  return n / info->block_elems * info->block_bytes;
}

void dequantize(GgmlType t, std::span<const std::byte> blocks, std::span<float> out) {
  ir::dequantize(codec_dtype(t, "dequantize of"), blocks, out);
}

void quantize(GgmlType t, std::span<const float> in, std::span<std::byte> out) {
  ir::quantize(codec_dtype(t, "quantize to"), in, out);
}

}  // namespace rlx::gguf
