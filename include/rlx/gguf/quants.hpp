#pragma once
// The codecs of a GGUF tensor's type: ggml's types that are RLX dtypes (f32, f16, bf16 and the
// block types, whose codecs live with the dtypes in rlx/ir/quants.hpp) convert through them; the
// rest (IQ*, TQ*, MXFP4, the integer and f64 types) are refused with rlx::Error naming the type.
#include <cstddef>
#include <optional>
#include <span>

#include "rlx/gguf/types.hpp"
#include "rlx/ir/dtype.hpp"

namespace rlx::gguf {

// The RLX dtype a tensor of ggml type t holds as is; nullopt when there is none.
std::optional<ir::DType> to_dtype(GgmlType t);
// The ggml type of a float or block dtype; rlx::Error naming the dtype for the others.
GgmlType to_ggml(ir::DType t);

bool can_dequantize(GgmlType t);
bool can_quantize(GgmlType t);
// The bytes of n elements of t; rlx::Error naming the type when n is not a multiple of its block.
std::size_t quantized_bytes(GgmlType t, std::size_t n);
// rlx::ir::dequantize / quantize on t's dtype (bit for bit as gguf.quants and llama.cpp's reference).
void dequantize(GgmlType t, std::span<const std::byte> blocks, std::span<float> out);
void quantize(GgmlType t, std::span<const float> in, std::span<std::byte> out);

}  // namespace rlx::gguf
