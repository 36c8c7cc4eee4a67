#include "rlx/gguf/requantize.hpp"

#include <fmt/format.h>

#include <vector>

#include "rlx/error.hpp"
#include "rlx/gguf/gguf.hpp"
#include "rlx/gguf/quants.hpp"

namespace rlx::gguf {

std::uint32_t llama_file_type(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 0;
    case GgmlType::F16: return 1;
    case GgmlType::Q4_0: return 2;
    case GgmlType::Q4_1: return 3;
    case GgmlType::Q8_0: return 7;
    case GgmlType::Q5_0: return 8;
    case GgmlType::Q5_1: return 9;
    case GgmlType::Q2_K: return 10;
    case GgmlType::Q3_K: return 12;  // Q3_K_M
    case GgmlType::Q4_K: return 15;  // Q4_K_M
    case GgmlType::Q5_K: return 17;  // Q5_K_M
    case GgmlType::Q6_K: return 18;
    case GgmlType::BF16: return 32;
    default: throw Error("quantize: no llama.cpp file type for " + std::string(ggml_type_info(t).name));
  }
}

namespace {

// The type a row of `cols` elements gets: the target if the row is whole blocks of it, else llama.cpp's
// fallback for the K-quants, else F16.
GgmlType type_for(GgmlType target, std::int64_t cols) {
  auto fits = [&](GgmlType t) { return cols % std::int64_t(ggml_type_info(t).block_elems) == 0; };
  if (fits(target)) return target;
  GgmlType fallback = GgmlType::F16;
  switch (target) {
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::Q4_K: fallback = GgmlType::Q5_0; break;
    case GgmlType::Q5_K: fallback = GgmlType::Q5_1; break;
    case GgmlType::Q6_K: fallback = GgmlType::Q8_0; break;
    default: break;
  }
  return fits(fallback) ? fallback : GgmlType::F16;
}

}  // namespace

RequantizeReport requantize(const std::filesystem::path& in, const std::filesystem::path& out, GgmlType target,
                            const RequantizeProgress& progress) {
  if (!can_quantize(target) || target == GgmlType::Q8_1 || target == GgmlType::Q8_K)
    throw Error("quantize: RLX cannot quantize a model to " + std::string(ggml_type_info(target).name) +
                " (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K F16 BF16 F32)");
  const File src = File::open(in);
  Writer w(src.metadata());
  w.metadata().set("general.file_type", llama_file_type(target));
  RequantizeReport report;
  report.bytes_in = src.file_size();
  std::vector<std::vector<std::byte>> keep;  // the new tensors' bytes, alive until the file is written
  keep.reserve(src.tensors().size());
  std::size_t done = 0;
  for (const TensorInfo& t : src.tensors()) {
    const std::span<const std::byte> bytes = src.data(t);
    const GgmlType type = t.dims.size() == 2 ? type_for(target, t.dims[0]) : t.type;
    if (type != t.type) {
      std::vector<float> f(static_cast<std::size_t>(t.numel()));
      dequantize(t.type, bytes, f);
      std::vector<std::byte> q(quantized_bytes(type, f.size()));
      quantize(type, f, q);
      keep.push_back(std::move(q));
      w.add_tensor(t.name, type, t.dims, std::span<const std::byte>(keep.back()));
    } else {
      w.add_tensor(t.name, t.type, t.dims, bytes);
    }
    ++report.tensors_per_type[std::string(ggml_type_info(type).name)];
    if (progress) progress(++done, src.tensors().size(), t.name);
  }
  w.write(out);
  report.bytes_out = w.file_size();
  return report;
}

}  // namespace rlx::gguf
