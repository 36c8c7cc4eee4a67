#pragma once
// Custom-op kernels for the MLX backend, written over MLX's arrays: a custom op
// (rlx/ir/custom_op.hpp) registered here runs as that function inside the MLX
// segment around it (traced by mx::compile with its neighbours in the compiled
// mode), and takes precedence over a host kernel of the same name on Device::Mlx.
// The header names mx::array, so a user of it compiles against MLX's headers
// (the mlx-cpu wheel's include folder) and links libmlx, as librlx does.
#include <mlx/mlx.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/ir/op.hpp"

namespace rlx::backends::mlx {

// The node's operands, in their stored dtypes, and its attributes ("op" names the custom op); the result must
// have the node's shape (a different dtype is cast to the node's). The function must be pure MLX ops: in the
// compiled mode it is traced once and replayed. An exception from it fails the run (or the compile, which traces
// it) as an rlx::Error naming the node.
using MlxKernel =
    std::function<::mlx::core::array(const std::vector<::mlx::core::array>& inputs, const ir::Attrs& attrs)>;

// Registering a name again replaces the kernel for later compiles (and for later runs of graphs that lower
// their kernels per run: the lazy and eager modes); a kernel already traced by mx::compile stays as it was.
void register_mlx_kernel(std::string op_name, MlxKernel kernel);
// A copy of the kernel for `op_name`, or an empty function.
MlxKernel find_mlx_kernel(std::string_view op_name);
std::vector<std::string> mlx_kernel_names();

}  // namespace rlx::backends::mlx
