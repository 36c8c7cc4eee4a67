#pragma once
// Custom ops' raw CUDA kernels (runtime::register_cuda_kernel, rlx/runtime/custom_kernels.hpp): which Native
// kernel of the LIR runs one, and the launch its fixed signature describes,
//   extern "C" __global__ void entry(float* arena, unsigned long long in0, unsigned long long in1,
//                                    unsigned long long in2, unsigned long long in3,
//                                    unsigned long long out, unsigned long long n),
// the offsets in 4-byte words of the arena. compile_lir places the operands (those outside the arena are copied
// into arena scratch first) and compiles the source through the cubin cache. Needs no GPU.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rlx/compile/lir.hpp"
#include "rlx/runtime/custom_kernels.hpp"

namespace rlx::backends::cuda {

inline constexpr std::size_t kRawKernelInputs = 4;

struct RawKernelLaunch {
  std::string op;     // the custom op
  std::string label;  // what compile errors name: "custom op '<op>' (kernel <k>)"
  const runtime::CudaKernel* kernel = nullptr;
  std::vector<compile::BufferId> inputs;  // the op's operands, in order
  compile::BufferId output = 0;
  std::int64_t n = 0;  // the output's elements
  unsigned grid = 1, block = 1;
};

// The custom op Native kernel `k` computes, or empty.
std::string custom_op_name(const compile::Kernel& k);

// The launch of Native kernel `k` when it computes a custom op with a raw CUDA kernel registered; nullopt
// otherwise. Throws rlx::Error naming the op for what the signature cannot carry: more than 4 inputs, an operand
// computed inside the kernel, a block size outside 1..1024.
std::optional<RawKernelLaunch> plan_raw_kernel(const compile::LirModule& lir, const compile::Kernel& k);

}  // namespace rlx::backends::cuda
