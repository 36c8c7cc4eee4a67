#pragma once
// Host fallback for GPU backends: one LIR kernel compiled for the CPU backend
// (found through the registry, so runtime does not depend on backends/cpu),
// run on contiguous host buffers that the GPU backend stages. A kernel's
// inputs become the module's inputs and its outputs the module's outputs, in
// kernel order; outputs are written in place into the caller's buffers.
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "rlx/compile/lir.hpp"
#include "rlx/runtime/backend.hpp"

namespace rlx::runtime {

// LIR kernel `kernel` of `lir` alone: input i is Input buffer i, output j an
// arena root that is graph output j; the body is unchanged.
compile::LirModule single_kernel_module(const compile::LirModule& lir, std::size_t kernel);

struct StagedKernel {
  std::unique_ptr<ExecutableGraph> exe;
  std::vector<std::size_t> input_bytes, output_bytes;  // per kernel input / output
  // Runs with inputs[i] and outputs[j] pointing at host buffers of those sizes; allocates nothing.
  void run(std::span<const void* const> inputs, std::span<void* const> outputs) const { exe->run(inputs, outputs); }
};

// Throws rlx::Error naming the kernel when the CPU backend cannot run it.
StagedKernel compile_host_kernel(const compile::LirModule& lir, std::size_t kernel,
                                 const compile::CompileOptions& options);

}  // namespace rlx::runtime
