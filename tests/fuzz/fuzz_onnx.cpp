// Fuzz target: the ONNX importer (rlx::onnx::import_bytes). Any input must either import or throw
// rlx::Error; anything else (a crash, a sanitizer report, another exception, a hang) is a bug. A model
// that imports must verify, and print as IR text that parses back. Symbolic dims bind to 2, so models
// with them get past the inputs; no base folder is given, so external data is refused, not read.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "rlx/error.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/onnx/onnx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(data),
                                     reinterpret_cast<const std::byte*>(data) + size);
  rlx::onnx::ImportOptions opts;
  for (const char* d : {"batch", "sequence", "N", "M"}) opts.dims[d] = 2;
  try {
    const auto m = rlx::onnx::import_bytes(bytes, opts);
    m.graph.verify();
    (void)rlx::ir::parse_text(rlx::ir::to_text(m.graph));
  } catch (const rlx::Error&) {
    return 0;  // a clear error is the right answer to bad input
  }
  return 0;
}
