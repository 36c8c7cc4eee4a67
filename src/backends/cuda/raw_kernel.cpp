// Custom ops' raw CUDA kernels (raw_kernel.hpp): the launch each one gets. No CUDA dependency.
#include "backends/cuda/raw_kernel.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "rlx/error.hpp"

namespace rlx::backends::cuda {

std::string custom_op_name(const compile::Kernel& k) {
  for (const auto& n : k.body.nodes())
    if (n.op == ir::OpKind::Custom) return n.attrs.get_str("op");
  return {};
}

std::optional<RawKernelLaunch> plan_raw_kernel(const compile::LirModule& lir, const compile::Kernel& k) {
  if (k.kind != compile::KernelKind::Native) return std::nullopt;
  RawKernelLaunch l;
  l.op = custom_op_name(k);
  if (l.op.empty() || !(l.kernel = runtime::find_cuda_kernel(l.op))) return std::nullopt;
  l.label = fmt::format("custom op '{}' (kernel {})", l.op, k.name);
  auto fail = [&](const std::string& why) { return Error(fmt::format("cuda: {}: {}", l.label, why)); };
  const ir::Node* op = nullptr;
  for (const auto& n : k.body.nodes())
    if (n.op == ir::OpKind::Custom) op = &n;
  if (op->inputs.size() > kRawKernelInputs)
    throw fail(
        fmt::format("{} inputs; a raw CUDA kernel's signature takes at most {}", op->inputs.size(), kRawKernelInputs));
  for (auto in : op->inputs) {
    const ir::Node& n = k.body.node(in);
    if (n.op != ir::OpKind::Input) throw fail("an operand is computed inside the kernel");
    l.inputs.push_back(k.input_buffer(n));
  }
  if (k.outputs.size() != 1 || k.body.outputs().size() != 1 || k.body.outputs()[0].node != op->id)
    throw fail("the kernel's output is not the op's result");
  l.output = k.outputs[0];
  l.n = lir.buffer(l.output).numel();
  const runtime::CudaKernel& rk = *l.kernel;
  if (rk.block < 1 || rk.block > 1024) throw fail(fmt::format("block size {} is not 1 to 1024", rk.block));
  l.block = rk.block;
  constexpr std::int64_t kMaxGrid = std::numeric_limits<std::int32_t>::max();
  l.grid = rk.grid ? rk.grid
                   : unsigned(std::clamp<std::int64_t>((l.n + rk.block - 1) / std::int64_t(rk.block), 1, kMaxGrid));
  return l;
}

}  // namespace rlx::backends::cuda
