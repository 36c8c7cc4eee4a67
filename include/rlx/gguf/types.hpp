#pragma once
// ggml's tensor types as GGUF stores them: the type id of a tensor-info entry,
// and each type's block (how many elements share one block, and the block's
// bytes). The ids and sizes are ggml's (ggml.h and ggml-common.h's block
// structs). tests/gguf checks them against the `gguf` package's
// GGML_QUANT_SIZES, but for Q8_1, whose 40 bytes there predate ggml's f16
// scales: ggml's block_q8_1 is 36.
#include <cstdint>
#include <optional>
#include <string_view>

namespace rlx::gguf {

#define RLX_GGML_TYPES(X) \
  X(F32, 0, 1, 4)         \
  X(F16, 1, 1, 2)         \
  X(Q4_0, 2, 32, 18)      \
  X(Q4_1, 3, 32, 20)      \
  X(Q5_0, 6, 32, 22)      \
  X(Q5_1, 7, 32, 24)      \
  X(Q8_0, 8, 32, 34)      \
  X(Q8_1, 9, 32, 36)      \
  X(Q2_K, 10, 256, 84)    \
  X(Q3_K, 11, 256, 110)   \
  X(Q4_K, 12, 256, 144)   \
  X(Q5_K, 13, 256, 176)   \
  X(Q6_K, 14, 256, 210)   \
  X(Q8_K, 15, 256, 292)   \
  X(IQ2_XXS, 16, 256, 66) \
  X(IQ2_XS, 17, 256, 74)  \
  X(IQ3_XXS, 18, 256, 98) \
  X(IQ1_S, 19, 256, 50)   \
  X(IQ4_NL, 20, 32, 18)   \
  X(IQ3_S, 21, 256, 110)  \
  X(IQ2_S, 22, 256, 82)   \
  X(IQ4_XS, 23, 256, 136) \
  X(I8, 24, 1, 1)         \
  X(I16, 25, 1, 2)        \
  X(I32, 26, 1, 4)        \
  X(I64, 27, 1, 8)        \
  X(F64, 28, 1, 8)        \
  X(IQ1_M, 29, 256, 56)   \
  X(BF16, 30, 1, 2)       \
  X(TQ1_0, 34, 256, 54)   \
  X(TQ2_0, 35, 256, 66)   \
  X(MXFP4, 39, 32, 17)

enum class GgmlType : std::uint32_t {
#define RLX_GGML_ENUM(name, id, block, bytes) name = id,  // NOLINT(bugprone-macro-parentheses): an enumerator name
  RLX_GGML_TYPES(RLX_GGML_ENUM)
#undef RLX_GGML_ENUM
};

struct GgmlTypeInfo {
  GgmlType type;
  std::string_view name;  // ggml's spelling: "Q4_K", "F16"
  std::uint32_t block_elems;
  std::uint32_t block_bytes;
};

inline constexpr GgmlTypeInfo kGgmlTypes[] = {
#define RLX_GGML_INFO(name, id, block, bytes) {GgmlType::name, #name, block, bytes},
    RLX_GGML_TYPES(RLX_GGML_INFO)
#undef RLX_GGML_INFO
};

// The entry of a type id read from a file; nullopt for an id ggml does not define.
constexpr std::optional<GgmlTypeInfo> ggml_type_info(std::uint32_t id) {
  for (const auto& t : kGgmlTypes)
    if (static_cast<std::uint32_t>(t.type) == id) return t;
  return std::nullopt;
}
constexpr GgmlTypeInfo ggml_type_info(GgmlType t) { return *ggml_type_info(static_cast<std::uint32_t>(t)); }
constexpr std::optional<GgmlType> parse_ggml_type(std::string_view name) {
  for (const auto& t : kGgmlTypes)
    if (t.name == name) return t.type;
  return std::nullopt;
}

}  // namespace rlx::gguf
