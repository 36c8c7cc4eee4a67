#pragma once
// Rewrites a GGUF model with its weights in another ggml type: what
// `rlx quantize IN OUT TYPE` runs (llama-quantize's job, without importance
// matrices). Each 2-d tensor is dequantized to f32 and quantized to the
// target; a tensor whose rows are not whole blocks of it falls back
// (K-quants to Q5_0, Q5_1 or Q8_0, as llama.cpp does for widths like 576;
// then F16). 1-d tensors (norms, biases) stay as they are.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "rlx/gguf/types.hpp"

namespace rlx::gguf {

struct RequantizeReport {
  std::map<std::string, std::int64_t> tensors_per_type;  // "Q8_0" -> count, in the written file
  std::uint64_t bytes_in = 0, bytes_out = 0;
};

// Called after each tensor: (tensors done, tensors in all, the tensor's name).
using RequantizeProgress = std::function<void(std::size_t done, std::size_t total, const std::string& name)>;

// rlx::Error naming the type for a target RLX cannot quantize to, or anything the reader or writer refuses.
RequantizeReport requantize(const std::filesystem::path& in, const std::filesystem::path& out, GgmlType target,
                            const RequantizeProgress& progress = {});

// llama.cpp's general.file_type for a model mostly of this type (LLAMA_FTYPE_MOSTLY_*; the K-quants as _M).
std::uint32_t llama_file_type(GgmlType target);

}  // namespace rlx::gguf
