// Reduce kernels: prologue program -> reduction -> epilogue program.
#include <algorithm>

#include "backends/cpu/kernels.hpp"
#include "rlx/error.hpp"

namespace rlx::backends::cpu {

namespace {

std::size_t align64(std::size_t n) { return (n + 63) / 64 * 64; }

class ReduceKernel final : public CpuKernel {
 public:
  ReducePlan plan;
  std::unique_ptr<CompiledProgram> pro, epi;  // epi is null when the reduce writes the output itself
  compile::BufferId out_buffer = 0;
  std::size_t pro_bytes = 0, epi_bytes = 0, out_bytes = 0;
  std::int64_t grain = 1;

  void finish() {
    plan.pro = &pro->view;
    pro_bytes = align64(pro->scratch_bytes);
    epi_bytes = epi ? align64(epi->scratch_bytes) : 0;
    thread_bytes = pro_bytes + epi_bytes + std::size_t(plan.chunk) * 16;
    const i64 n_out = plan.outer * plan.inner;
    out_bytes = epi ? align64(std::size_t(n_out) * 8) : 0;
    shared_bytes = out_bytes + (plan.splits > 1 ? std::size_t(plan.splits * n_out) * sizeof(Acc) : 0);
    i64 unit_elems = std::max<i64>(1, plan.red * (plan.inner == 1 ? 1 : plan.chunk) / plan.splits);
    grain = std::max<i64>(1, kGrain / unit_elems);
  }

  // Output elements [begin, end) that units [u0, u1) complete (splits == 1).
  std::pair<i64, i64> outputs_of(i64 u0, i64 u1) const {
    if (plan.inner == 1) return {u0, u1};
    auto start = [&](i64 u) { return (u / plan.chunks) * plan.inner + (u % plan.chunks) * plan.chunk; };
    auto last = u1 - 1;
    return {start(u0), (last / plan.chunks) * plan.inner + std::min(plan.inner, (last % plan.chunks + 1) * plan.chunk)};
  }

  void run(const RunCtx& c) const override {
    std::byte* out = epi ? c.shared : c.ptrs[out_buffer];
    std::byte* aux[1] = {out};
    auto* partial = reinterpret_cast<Acc*>(c.shared + out_bytes);
    auto ctx = [&](std::byte* ts) {
      return ReduceCtx{EwCtx{c.ptrs, nullptr, ts}, ts + pro_bytes + epi_bytes, partial, out};
    };
    auto epilogue = [&](std::byte* ts, i64 o0, i64 o1) {
      if (epi) c.isa->ew_run(epi->view, EwCtx{c.ptrs, aux, ts + pro_bytes}, o0, o1);
    };
    const i64 units = plan.outer * plan.chunks * plan.splits;
    if (plan.splits == 1) {
      parallel_for(
          units, grain,
          [&](i64 u0, i64 u1) {
            std::byte* ts = c.thread_scratch();
            c.isa->reduce_units(plan, ctx(ts), u0, u1);
            auto [o0, o1] = outputs_of(u0, u1);
            epilogue(ts, o0, o1);
          },
          c.max_threads);
      return;
    }
    parallel_for(
        units, 1, [&](i64 u0, i64 u1) { c.isa->reduce_units(plan, ctx(c.thread_scratch()), u0, u1); }, c.max_threads);
    parallel_for(
        plan.outer * plan.inner, kGrain,
        [&](i64 o0, i64 o1) {
          std::byte* ts = c.thread_scratch();
          c.isa->reduce_combine(plan, ctx(ts), o0, o1);
          epilogue(ts, o0, o1);
        },
        c.max_threads);
  }
};

RedOp red_op(ir::OpKind k) {
  switch (k) {
    case ir::OpKind::ReduceSum: return RedOp::Sum;
    case ir::OpKind::ReduceMean: return RedOp::Mean;
    case ir::OpKind::ReduceMax: return RedOp::Max;
    case ir::OpKind::ReduceMin: return RedOp::Min;
    case ir::OpKind::ReduceProd: return RedOp::Prod;
    case ir::OpKind::ArgMax: return RedOp::ArgMax;
    default: return RedOp::ArgMin;
  }
}

}  // namespace

std::unique_ptr<CpuKernel> build_reduce(const BuildCtx& b) {
  const auto& body = b.kernel.body;
  const ir::Node& rn = b.anchor();
  if (ir::op_info(rn.op).cls != ir::OpClass::Reduce)
    b.fail("expected a reduce op, found " + std::string(ir::op_name(rn.op)));
  const ir::Node& x = body.node(rn.inputs.at(0));
  const auto ext = x.shape.extents();
  const std::size_t rank = ext.size();
  const RedOp op = red_op(rn.op);
  const bool arg = op == RedOp::ArgMax || op == RedOp::ArgMin;

  std::vector<bool> reduced(rank, false);
  if (arg) {
    if (rank > 0) reduced[std::size_t(ir::normalize_axis(rn.attrs.get_int("axis"), rank))] = true;
  } else {
    for (auto a : rn.attrs.get_ints("axes")) reduced[std::size_t(ir::normalize_axis(a, rank))] = true;
  }
  i64 red = 1, n_out = 1;
  int first = -1, last = -1;
  for (std::size_t d = 0; d < rank; ++d) {
    (reduced[d] ? red : n_out) *= ext[d];
    if (reduced[d] && ext[d] != 1) {
      if (first < 0) first = int(d);
      last = int(d);
    }
  }
  if (arg && red == 0 && n_out > 0) b.fail("argmax/argmin over an empty axis");

  auto k = std::make_unique<ReduceKernel>();
  ReducePlan& p = k->plan;
  p.op = op;
  p.ct = compute_type(x.dtype);
  p.out_ct = arg ? CT::I64 : p.ct;
  p.red = red;
  p.outer = n_out;
  std::vector<int> order;
  if (red > 1 && n_out > 0) {
    bool contiguous = true;
    for (int d = first; d <= last; ++d)
      contiguous = contiguous && (reduced[std::size_t(d)] || ext[std::size_t(d)] == 1);
    if (contiguous) {
      p.outer = 1;
      for (int d = 0; d < first; ++d) p.outer *= ext[std::size_t(d)];
      p.inner = n_out / std::max<i64>(p.outer, 1);
    } else {
      // Iterate the kept axes first: the reduced ones become one contiguous inner run.
      for (std::size_t d = 0; d < rank; ++d)
        if (!reduced[d]) order.push_back(int(d));
      for (std::size_t d = 0; d < rank; ++d)
        if (reduced[d]) order.push_back(int(d));
    }
  }
  if (p.inner > 1) {
    p.chunk = std::min<i64>(p.inner, 8192);  // whole rows when they fit in L2: one sequential stream
    p.chunks = (p.inner + p.chunk - 1) / p.chunk;
  }
  const i64 base_units = p.outer * p.chunks, T = b.threads;
  if (T > 1 && base_units < 2 * T && red >= 2048 && n_out * red >= 65536)
    p.splits = std::max<i64>(1, std::min((4 * T + base_units - 1) / base_units, red / 1024));

  ProgramBuilder pb(body, ext, order);
  b.bind_inputs(pb);
  pb.result(x.id);
  k->pro = pb.build(b.where() + " prologue");

  const auto outs = body.output_ids();
  if (outs.size() != 1 || b.kernel.outputs.size() != 1) b.fail("a reduce kernel has exactly one output");
  const auto& ob = b.out(0);
  k->out_buffer = ob.id;
  if (outs[0] != rn.id || ob.dtype != storage_of(p.out_ct)) {
    ProgramBuilder eb(body, ob.shape);
    b.bind_inputs(eb);
    eb.bind(rn.id, Source{-1, storage_of(p.out_ct), rn.shape.extents()});
    eb.store(outs[0], ob.id, ob.dtype, numel(ob.shape) * i64(ir::dtype_size(ob.dtype)) >= b.stream_bytes);
    k->epi = eb.build(b.where() + " epilogue");
  }
  k->finish();
  return k;
}

}  // namespace rlx::backends::cpu
