#pragma once
// One LIR kernel body node as mlx::core ops, and the rule for which kernels
// MLX runs (the others go to the host through the CPU backend). Built only
// with MLX (RLX_HAVE_MLX).
#include <mlx/mlx.h>

#include <span>
#include <string>
#include <vector>

#include "rlx/compile/lir.hpp"

namespace rlx::backends::mlx {

namespace mx = ::mlx::core;

// The MLX dtype a buffer of `t` is held in: block-quantized types are held as
// their bytes (u8), which only host kernels read.
mx::Dtype storage_dtype(ir::DType t);
mx::Shape storage_shape(ir::DType t, const std::vector<std::int64_t>& shape);

// A copy of `nbytes` host bytes as an array of `t` and `shape`.
mx::array from_bytes(const void* data, ir::DType t, const std::vector<std::int64_t>& shape);
// Where an op on `a` runs: MLX's CPU device for f64, which MLX's GPU does not compute; else the default device.
mx::StreamOrDevice device_for(const mx::array& a);
// Evaluates `a` and copies its elements, row-major, into `dst`.
void to_bytes(mx::array a, void* dst, std::size_t nbytes);

// Empty when MLX runs the kernel; otherwise why not (the host runs it).
std::string host_reason(const compile::Kernel& k);

// Node `n` of a kernel body over the values of its operands.
mx::array lower_node(const ir::Graph& body, const ir::Node& n, std::span<const mx::array> x);

}  // namespace rlx::backends::mlx
