#pragma once
// Text views of GGUF files and values, for `rlx inspect` (docs/gguf.md).
#include <cstddef>
#include <string>

#include "rlx/gguf/gguf.hpp"

namespace rlx::gguf {

struct InspectOptions {
  std::size_t max_items = 8;    // array elements shown before "... (N more)"
  std::size_t max_string = 96;  // bytes of a string shown before it is cut
  bool tensors = true;          // the tensor table
};

// One value on one line: strings quoted with non-printable bytes escaped, arrays as "[n] [a, b, ...]".
std::string format_value(const Value& v, const InspectOptions& options = {});
// The version, metadata, tensor table and totals of a file.
std::string inspect_text(const File& file, const InspectOptions& options = {});

}  // namespace rlx::gguf
