// The CUDA backend's device-memory layout (layout.hpp); no CUDA dependency, so tests check it without a GPU.
#include "backends/cuda/layout.hpp"

#include <algorithm>
#include <string>

#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/env.hpp"
#include "rlx/error.hpp"

namespace rlx::backends::cuda {

using compile::BufferRole;

Layout lay_out(const compile::LirModule& lir) {
  Layout l;
  // The arena: the LIR's memory plan, then the inputs.
  std::uint64_t arena = align_up(std::uint64_t(std::max<std::int64_t>(lir.memory.arena_bytes, 0)));
  for (compile::BufferId id : lir.inputs) {
    l.input_at.push_back(arena);
    arena = align_up(arena + std::uint64_t(lir.buffer(id).nbytes()));
  }
  l.arena_bytes = arena;
  for (compile::BufferId id : lir.params) {
    l.param_off.push_back(l.params_bytes);
    l.params_bytes = align_up(l.params_bytes + std::uint64_t(lir.buffer(id).nbytes()));
  }
  for (const auto& v : lir.constant_values) {
    l.const_off.push_back(l.constants_bytes);
    l.constants_bytes = align_up(l.constants_bytes + std::uint64_t(v.nbytes()));
  }
  l.locs.resize(lir.buffers.size());
  for (const auto& b : lir.buffers) {
    const auto& root = lir.buffer(b.root < 0 ? b.id : b.root);
    if (root.root >= 0 && root.root != root.id)
      throw Error("cuda: buffer " + std::to_string(b.id) + " is a view of a view (" + std::to_string(root.id) + ")");
    const auto view = std::uint64_t(b.root < 0 || b.root == b.id ? 0 : b.view_offset);
    const auto ext = std::size_t(root.external_index);
    Loc& loc = l.locs[std::size_t(b.id)];
    switch (root.role) {
      case BufferRole::Arena: loc = {Where::Arena, std::uint64_t(root.arena_offset) + view}; break;
      case BufferRole::Input: loc = {Where::Arena, l.input_at.at(ext) + view}; break;
      case BufferRole::Param: loc = {Where::Params, l.param_off.at(ext) + view}; break;
      case BufferRole::Constant: loc = {Where::Constants, l.const_off.at(ext) + view}; break;
    }
  }
  return l;
}

std::int64_t offset_alignment(std::uint64_t offset) {
  std::uint64_t a = kArenaAlignment;
  while (a > 1 && offset % a) a /= 2;
  return std::int64_t(a);
}

codegen::c::CudaOptions cuda_options(const Layout& layout, std::int64_t vector_bytes) {
  codegen::c::CudaOptions o;
  o.vector_bytes = vector_bytes;
  o.vector_unroll = vector_unroll();
  o.product_alignment = std::int64_t(kArenaAlignment);  // its own allocation, read from the start
  for (const Loc& loc : layout.locs) o.buffer_alignment.push_back(offset_alignment(loc.offset));
  return o;
}

std::int64_t vector_bytes() {
  const long long v = env::get_int("RLX_CUDA_VECTOR_BYTES").value_or(16);
  if (v != 0 && v != 16) throw Error("RLX_CUDA_VECTOR_BYTES is " + std::to_string(v) + "; it must be 0 or 16");
  return v;
}

std::int64_t vector_unroll() {
  const long long v = env::get_int("RLX_CUDA_VECTOR_UNROLL").value_or(1);
  if (v < 0 || v > 8) throw Error("RLX_CUDA_VECTOR_UNROLL is " + std::to_string(v) + "; it must be 0 to 8");
  return v;
}

std::int64_t blocks_per_sm() {
  const long long v = env::get_int("RLX_CUDA_BLOCKS_PER_SM").value_or(0);
  if (v < 0 || v > 1024) throw Error("RLX_CUDA_BLOCKS_PER_SM is " + std::to_string(v) + "; it must be 0 to 1024");
  return v;
}

codegen::c::CudaModule emit(const compile::LirModule& lir, std::int64_t bytes) {
  return codegen::c::emit_cuda(lir, cuda_options(lay_out(lir), bytes));
}

const ir::Node* sole_op(const compile::Kernel& k, std::vector<compile::BufferId>* ins, std::string* why) {
  const ir::Node* op = nullptr;
  for (const auto& n : k.body.nodes()) {
    if (n.op == ir::OpKind::Input) continue;
    if (op) return *why = "the kernel also computes " + std::string(ir::op_name(n.op)), nullptr;
    op = &n;
  }
  if (!op) return *why = "the kernel computes nothing", nullptr;
  if (k.outputs.size() != 1 || k.body.outputs().size() != 1 || k.body.outputs()[0].node != op->id)
    return *why = "the kernel's output is not the op's result", nullptr;
  ins->clear();
  for (auto in : op->inputs) {
    const ir::Node& n = k.body.node(in);
    if (n.op != ir::OpKind::Input) return *why = "an operand is computed inside the kernel", nullptr;
    ins->push_back(k.input_buffer(n));
  }
  return op;
}

}  // namespace rlx::backends::cuda
