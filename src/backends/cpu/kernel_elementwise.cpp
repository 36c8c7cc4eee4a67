// Elementwise kernels and the helpers every kernel builder shares.
#include <cmath>
#include <cstring>

#include "backends/cpu/gemm_pack.hpp"
#include "backends/cpu/kernels.hpp"
#include "backends/cpu/lowp_chain.hpp"
#include "rlx/error.hpp"

namespace rlx::backends::cpu {

std::int64_t numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

void BuildCtx::fail(const std::string& msg) const { throw Error(where() + ": " + msg); }

void BuildCtx::bind_inputs(ProgramBuilder& b) const {
  int ordinal = 0;
  for (const auto& n : kernel.body.nodes()) {
    if (n.op != ir::OpKind::Input) continue;
    int i = body_input_index(n, ordinal++);
    if (i < 0 || std::size_t(i) >= kernel.inputs.size())
      fail("body input " + std::to_string(i) + " has no kernel input buffer");
    const auto& buf = in(std::size_t(i));
    b.bind(n.id, Source{buf.id, buf.dtype, buf.shape});
  }
}

const compile::Buffer& BuildCtx::in_of(ir::NodeId id) const {
  const auto& body = kernel.body;
  const ir::Node& n = body.node(id);
  if (n.op != ir::OpKind::Input)
    fail(ir::describe_node(body, n) + " must be a kernel input, not computed inside the kernel");
  int ordinal = 0;
  for (const auto& m : body.nodes()) {
    if (m.id == id) break;
    ordinal += m.op == ir::OpKind::Input;
  }
  int i = body_input_index(n, ordinal);
  if (i < 0 || std::size_t(i) >= kernel.inputs.size())
    fail("body input " + std::to_string(i) + " has no kernel input buffer");
  return in(std::size_t(i));
}

const ir::Node& BuildCtx::anchor() const {
  for (const auto& n : kernel.body.nodes()) {
    if (n.op == ir::OpKind::Input || n.op == ir::OpKind::Constant || ir::is_elementwise(n.op)) continue;
    // A Native kernel's permutes are its op's layout views (BackendTraits::attention_layout_views).
    if (kernel.kind == compile::KernelKind::Native && n.op == ir::OpKind::Permute) continue;
    return n;
  }
  fail("body has no " + std::string(compile::kernel_kind_name(kernel.kind)) + " op");
}

namespace {

class ElementwiseKernel final : public CpuKernel {
 public:
  ElementwiseKernel(std::unique_ptr<CompiledProgram> p, std::int64_t n) : prog_(std::move(p)), n_(n) {
    thread_bytes = prog_->scratch_bytes;
    // Cheap programs need big tasks to amortize dispatch; heavy ones balance better in small ones.
    grain_ = std::max<std::int64_t>(kBlock, kGrain * 4 / std::int64_t(prog_->instructions() + 3));
    grain_ = (grain_ + kBlock - 1) / kBlock * kBlock;
  }
  void run(const RunCtx& c) const override {
    parallel_for(
        n_, grain_,
        [&](i64 b, i64 e) {
          c.isa->ew_run(prog_->view, EwCtx{c.ptrs, nullptr, c.thread_scratch()}, b, e);
        },
        c.max_threads);
  }

 private:
  std::unique_ptr<CompiledProgram> prog_;
  std::int64_t n_, grain_;
};

}  // namespace

std::unique_ptr<CpuKernel> build_elementwise(const BuildCtx& b) {
  const auto& body = b.kernel.body;
  if (b.kernel.outputs.empty()) b.fail("has no outputs");
  // A quantize to u8 or i8 runs as the int8 GEMM's store does (lowp_chain.hpp): vectorized end to end.
  if (auto k = build_quantize_chain(b, b.packs && b.packs->lowp ? *b.packs->lowp : select_lowp_table())) return k;
  const auto& out0 = b.out(0);
  ProgramBuilder pb(body, out0.shape);
  b.bind_inputs(pb);
  auto outs = body.output_ids();
  if (outs.size() != b.kernel.outputs.size()) b.fail("body outputs and kernel outputs differ in number");
  // Non-temporal stores where everything the kernel writes outgrows the cache, counted over all its outputs:
  // an optimizer's update writes three or four arrays of a weight's size, each under the threshold, which
  // ordinary stores would each read for ownership first (a third more traffic for Adam's step).
  i64 written = 0;
  for (std::size_t j = 0; j < outs.size(); ++j) written += numel(b.out(j).shape) * i64(ir::dtype_size(b.out(j).dtype));
  for (std::size_t j = 0; j < outs.size(); ++j) {
    const auto& buf = b.out(j);
    if (numel(buf.shape) != numel(out0.shape)) b.fail("outputs differ in element count");
    pb.store(outs[j], buf.id, buf.dtype, written >= b.stream_bytes);
  }
  return std::make_unique<ElementwiseKernel>(pb.build(b.where()), numel(out0.shape));
}

}  // namespace rlx::backends::cpu
