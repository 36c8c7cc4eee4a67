#include "rlx/runtime/host_kernel.hpp"

#include <fmt/format.h>

#include "rlx/error.hpp"

namespace rlx::runtime {

compile::LirModule single_kernel_module(const compile::LirModule& lir, std::size_t kernel) {
  const compile::Kernel& k = lir.kernels.at(kernel);
  compile::LirModule m;
  m.name = lir.name + "/" + k.name;
  auto add = [&](compile::BufferId src, compile::BufferRole role, std::int32_t index) {
    const compile::Buffer& b = lir.buffer(src);
    compile::Buffer nb;
    nb.id = compile::BufferId(m.buffers.size());
    nb.role = role;
    nb.dtype = b.dtype;
    nb.shape = b.shape;
    nb.name = b.name;
    nb.external_index = index;
    nb.root = nb.id;
    m.buffers.push_back(std::move(nb));
    return m.buffers.back().id;
  };
  compile::Kernel nk = k;
  nk.inputs.clear();
  nk.outputs.clear();
  for (std::size_t i = 0; i < k.inputs.size(); ++i) {
    nk.inputs.push_back(add(k.inputs[i], compile::BufferRole::Input, std::int32_t(i)));
    m.inputs.push_back(nk.inputs.back());
  }
  std::int64_t offset = 0;
  for (auto out : k.outputs) {
    auto id = add(out, compile::BufferRole::Arena, -1);
    auto& b = m.buffers[std::size_t(id)];
    b.arena_offset = offset;
    offset += (b.nbytes() + 63) / 64 * 64;
    nk.outputs.push_back(id);
    m.outputs.push_back(id);
    m.output_names.push_back(b.name);
  }
  m.kernels.push_back(std::move(nk));
  m.memory.arena_bytes = m.memory.naive_bytes = offset;
  m.memory.alignment = 64;
  return m;
}

StagedKernel compile_host_kernel(const compile::LirModule& lir, std::size_t kernel,
                                 const compile::CompileOptions& options) {
  auto module = single_kernel_module(lir, kernel);
  StagedKernel h;
  try {
    h.exe = make_backend(Device::Cpu)->compile_lir(module, options);
  } catch (const Error& e) {
    throw Error(fmt::format("host fallback for kernel '{}': {}", lir.kernels[kernel].name, e.what()));
  }
  for (auto id : module.inputs) h.input_bytes.push_back(std::size_t(module.buffer(id).nbytes()));
  for (auto id : module.outputs) h.output_bytes.push_back(std::size_t(module.buffer(id).nbytes()));
  return h;
}

}  // namespace rlx::runtime
