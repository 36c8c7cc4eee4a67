#include "backends/cpu/lowp_chain.hpp"

#include <algorithm>
#include <cmath>

#include "rlx/env.hpp"

namespace rlx::backends::cpu {

namespace {

using ir::DType;
using ir::OpKind;

// How many times each body node is read.
std::vector<int> reader_counts(const ir::Graph& body) {
  std::vector<int> n(body.size(), 0);
  for (const auto& node : body.nodes())
    for (auto in : node.inputs) ++n[std::size_t(in)];
  for (auto id : body.output_ids()) ++n[std::size_t(id)];
  return n;
}

}  // namespace

I8Epilogue Int8Chain::bind(const RunCtx& c, I8EpiStep* scratch) const {
  for (std::size_t i = 0; i < steps.size(); ++i) {
    scratch[i] = steps[i];
    if (step_buf[i] >= 0) scratch[i].col = reinterpret_cast<const float*>(c.ptrs[step_buf[i]]);
  }
  return {.steps = scratch, .n_steps = int(steps.size()), .out = out, .dst = c.ptrs[out_buf]};
}

namespace {

// The chain from body node `start` (the f32 value the steps begin with: the accumulator's cast, or an f32
// input) to the kernel's one output, over rows of N columns.
std::optional<Int8Chain> walk(const BuildCtx& b, ir::NodeId start, std::int64_t N) {
  const ir::Graph& body = b.kernel.body;
  const auto outs = body.output_ids();
  const auto readers = reader_counts(body);
  // The user of each chain node: the one node that reads it.
  std::vector<ir::NodeId> user(body.size(), -1);
  for (const auto& node : body.nodes())
    for (auto in : node.inputs) user[std::size_t(in)] = node.id;
  Int8Chain chain;
  chain.out_buf = b.out(0).id;
  auto next = [&](ir::NodeId id) -> const ir::Node* {
    if (readers[std::size_t(id)] != 1 || id == outs[0]) return nullptr;
    return &body.node(user[std::size_t(id)]);
  };
  // A binary op's other operand: a scalar constant, or an f32 vector of N (a constant, or a kernel input such
  // as a bias param) broadcast along the rows.
  auto operand = [&](ir::NodeId id, I8EpiStep& s, compile::BufferId& buf) {
    const ir::Node& o = body.node(id);
    if (o.dtype != DType::F32) return false;
    const auto ext = o.shape.extents();
    for (std::size_t d = 0; d + 1 < ext.size(); ++d)
      if (ext[d] != 1) return false;
    if (o.op == OpKind::Constant && o.value) {
      if (o.value->numel() == 1) {
        s.k = float(ir::round_to_dtype(o.value->get(0), DType::F32));
        return true;
      }
      if (ext.empty() || ext.back() != N || o.value->dtype() != DType::F32) return false;
      chain.constants.push_back(o.value);
      s.col = o.value->data_as<float>();
      return true;
    }
    if (o.op != OpKind::Input || ext.empty() || ext.back() != N) return false;
    const auto& in = b.in_of(id);
    if (in.dtype != DType::F32 || in.shape.empty() || in.shape.back() != N || numel(in.shape) != N) return false;
    buf = in.id;
    return true;
  };
  ir::NodeId prev = start;
  float lo = -INFINITY, hi = INFINITY;  // the range a clamp last left the values in
  for (const ir::Node* n = next(prev); n; prev = n->id, n = next(prev)) {
    I8EpiStep s;
    compile::BufferId buf = -1;
    if (n->op == OpKind::Cast && (n->dtype == DType::U8 || n->dtype == DType::I8) && n->id == outs[0]) {
      const float tlo = n->dtype == DType::U8 ? 0 : -128, thi = n->dtype == DType::U8 ? 255 : 127;
      if (!(lo >= tlo && hi <= thi) || b.out(0).dtype != n->dtype) return std::nullopt;
      chain.out = n->dtype == DType::U8 ? I8Epilogue::U8 : I8Epilogue::I8;
      return chain;
    }
    if (n->dtype != DType::F32 || chain.steps.size() == std::size_t(Int8Chain::kMaxSteps)) return std::nullopt;
    const bool commutes = n->op == OpKind::Add || n->op == OpKind::Mul || n->op == OpKind::Max || n->op == OpKind::Min;
    switch (n->op) {
      case OpKind::Add:
      case OpKind::Sub:
      case OpKind::Mul:
      case OpKind::Div:
      case OpKind::Max:
      case OpKind::Min: {
        const bool first = n->inputs[0] == prev;
        if (n->inputs[0] == n->inputs[1] || (!first && !commutes && n->op != OpKind::Sub)) return std::nullopt;
        if (!operand(n->inputs[first ? 1 : 0], s, buf)) return std::nullopt;
        s.kind = n->op == OpKind::Add   ? I8EpiStep::Add
                 : n->op == OpKind::Sub ? (first ? I8EpiStep::Sub : I8EpiStep::RSub)
                 : n->op == OpKind::Mul ? I8EpiStep::Mul
                 : n->op == OpKind::Div ? I8EpiStep::Div
                 : n->op == OpKind::Max ? I8EpiStep::Max
                                        : I8EpiStep::Min;
        lo = -INFINITY, hi = INFINITY;
        break;
      }
      case OpKind::Relu:
        s.kind = I8EpiStep::Relu;
        lo = std::max(lo, 0.0f), hi = std::max(hi, 0.0f);
        break;
      case OpKind::Round:
        s.kind = I8EpiStep::Round;
        lo = std::floor(lo), hi = std::ceil(hi);
        break;
      case OpKind::Clamp: {
        s.kind = I8EpiStep::Clamp;
        const double cl = n->attrs.get_float("min"), ch = n->attrs.get_float("max");
        if (std::isnan(cl) || std::isnan(ch)) return std::nullopt;
        s.lo = float(cl), s.hi = float(ch);
        lo = std::min(s.lo, s.hi), hi = s.hi;
        break;
      }
      default: return std::nullopt;
    }
    chain.steps.push_back(s);
    chain.step_buf.push_back(buf);
    if (n->id == outs[0]) {
      if (b.out(0).dtype != DType::F32) return std::nullopt;
      chain.out = I8Epilogue::F32;
      return chain;
    }
  }
  return std::nullopt;
}

// A standalone quantize: the chain from an f32 input to a u8 or i8 output, run by i8_epilogue over rows.
class QuantizeChainKernel final : public CpuKernel {
 public:
  QuantizeChainKernel(Int8Chain chain, compile::BufferId in, std::int64_t rows, std::int64_t cols,
                      const LowpTable& table)
      : chain_(std::move(chain)), in_(in), rows_(rows), cols_(cols), table_(table) {}
  void run(const RunCtx& c) const override {
    I8EpiStep steps[Int8Chain::kMaxSteps];
    I8Epilogue e = chain_.bind(c, steps);
    e.f32_in = true;
    e.ldd = cols_;
    // Rows in tasks of at least kGrain elements: a few microseconds of work is not worth a second thread.
    parallel_for(
        rows_, std::max<std::int64_t>(1, kGrain / cols_),
        [&](i64 m0, i64 m1) { table_.i8_epilogue(c.ptrs[in_], cols_, m0, m1, 0, cols_, e); }, c.max_threads);
  }

 private:
  Int8Chain chain_;
  compile::BufferId in_;
  std::int64_t rows_, cols_;
  const LowpTable& table_;
};

}  // namespace

std::optional<Int8Chain> match_int8_chain(const BuildCtx& b, const ir::Node& mm) {
  if (!env::get_bool("RLX_CPU_INT8_EPILOGUE")) return std::nullopt;
  const ir::Graph& body = b.kernel.body;
  if (body.output_ids().size() != 1 || b.kernel.outputs.size() != 1 || mm.dtype != DType::I32) return std::nullopt;
  const auto mm_ext = mm.shape.extents();
  if (b.out(0).shape != mm_ext) return std::nullopt;
  // The accumulator's cast to f32 starts the chain.
  const auto readers = reader_counts(body);
  if (readers[std::size_t(mm.id)] != 1) return std::nullopt;
  for (const auto& n : body.nodes())
    if (n.inputs.size() == 1 && n.inputs[0] == mm.id && n.op == OpKind::Cast && n.dtype == DType::F32)
      return walk(b, n.id, mm_ext.back());
  return std::nullopt;
}

std::unique_ptr<CpuKernel> build_quantize_chain(const BuildCtx& b, const LowpTable& table) {
  if (!env::get_bool("RLX_CPU_INT8_EPILOGUE")) return nullptr;
  const ir::Graph& body = b.kernel.body;
  if (body.output_ids().size() != 1 || b.kernel.outputs.size() != 1) return nullptr;
  const auto& out = b.out(0);
  if ((out.dtype != DType::U8 && out.dtype != DType::I8) || out.shape.empty() || out.shape.back() == 0) return nullptr;
  // The f32 input of the output's shape that the chain starts from (others are its column operands).
  for (const auto& n : body.nodes()) {
    if (n.op != OpKind::Input || n.dtype != DType::F32) continue;
    const auto& in = b.in_of(n.id);
    if (in.dtype != DType::F32 || in.shape != out.shape) continue;
    auto chain = walk(b, n.id, out.shape.back());
    if (!chain || chain->out == I8Epilogue::F32) return nullptr;
    const std::int64_t cols = out.shape.back();
    return std::make_unique<QuantizeChainKernel>(std::move(*chain), in.id, numel(out.shape) / cols, cols, table);
  }
  return nullptr;
}

}  // namespace rlx::backends::cpu
