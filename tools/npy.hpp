#pragma once
// NumPy's .npy files (format 1.0-3.0, little-endian, C order) for `rlx run`'s inputs and outputs.
#include <filesystem>

#include "rlx/ir/tensor.hpp"

namespace rlx::tools {

// rlx::Error naming the file and the field for anything it does not read: Fortran order, a big-endian
// or object dtype, a header or data size that does not match the file.
ir::Tensor read_npy(const std::filesystem::path& path);
void write_npy(const std::filesystem::path& path, const ir::Tensor& t);

}  // namespace rlx::tools
