#include "rlx/runtime/host_kernel.hpp"

#include <fmt/format.h>

#include <map>

#include "rlx/error.hpp"
#include "rlx/ir/op.hpp"

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
  std::int64_t offset = 0;
  auto place = [&](compile::BufferId id) {
    auto& b = m.buffers[std::size_t(id)];
    b.arena_offset = offset;
    offset += (b.nbytes() + 63) / 64 * 64;
  };
  std::vector<compile::BufferId> ins, outs;
  for (std::size_t i = 0; i < k.inputs.size(); ++i) {
    ins.push_back(add(k.inputs[i], compile::BufferRole::Input, std::int32_t(i)));
    m.inputs.push_back(ins.back());
  }
  for (auto out : k.outputs) {
    outs.push_back(add(out, compile::BufferRole::Arena, -1));
    place(outs.back());
    m.outputs.push_back(outs.back());
    m.output_names.push_back(m.buffers[std::size_t(outs.back())].name);
  }
  std::size_t computed = 0;
  for (const auto& n : k.body.nodes()) computed += n.op != ir::OpKind::Input;
  if (k.kind != compile::KernelKind::Native || computed <= 1) {
    compile::Kernel nk = k;
    nk.inputs = ins;
    nk.outputs = outs;
    m.kernels.push_back(std::move(nk));
  } else {
    // A Native kernel with layout views around its op (BackendTraits::attention_layout_views): one kernel per
    // op, as the lowering would have made them without the views, through arena buffers of their own.
    std::map<ir::NodeId, compile::BufferId> buffer_of;  // body node -> the buffer holding its value
    for (const auto& n : k.body.nodes())                // body input "in<i>" is kernel input i
      if (n.op == ir::OpKind::Input) buffer_of[n.id] = ins.at(std::stoul(n.attrs.get_str("name").substr(2)));
    std::map<ir::NodeId, std::size_t> output_of;
    for (std::size_t j = 0; j < k.body.outputs().size(); ++j) output_of[k.body.outputs()[j].node] = j;
    for (const auto& n : k.body.nodes()) {
      if (n.op == ir::OpKind::Input) continue;
      if (n.op == ir::OpKind::Constant)
        throw Error(
            fmt::format("host fallback for kernel '{}': a constant among "
                        "its views",
                        k.name));
      compile::Kernel part;
      const auto cls = ir::op_info(n.op).cls;
      part.kind = cls == ir::OpClass::Movement ? compile::KernelKind::Movement : compile::KernelKind::Native;
      part.name = fmt::format("{}/{}", k.name, ir::op_name(n.op));
      part.source_nodes = k.source_nodes;
      std::vector<ir::NodeId> operands;
      for (auto in : n.inputs) {
        const compile::BufferId b = buffer_of.at(in);
        const auto& buf = m.buffer(b);
        operands.push_back(part.body.input(fmt::format("in{}", part.inputs.size()), ir::Shape(buf.shape), buf.dtype));
        part.inputs.push_back(b);
      }
      part.body.add_output(part.body.add(n.op, std::move(operands), n.attrs));
      compile::BufferId out;
      if (auto it = output_of.find(n.id); it != output_of.end()) {
        out = outs.at(it->second);
      } else {
        compile::Buffer b;
        b.id = compile::BufferId(m.buffers.size());
        b.role = compile::BufferRole::Arena;
        b.dtype = n.dtype;
        b.shape = n.shape.extents();
        b.name = fmt::format("{}/%{}", k.name, n.id);
        b.root = b.id;
        m.buffers.push_back(std::move(b));
        out = m.buffers.back().id;
        place(out);
      }
      part.outputs.push_back(out);
      buffer_of[n.id] = out;
      m.kernels.push_back(std::move(part));
    }
  }
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
