#include "rlx/compile/quantize.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "rlx/compile/passes_extra.hpp"
#include "rlx/compile/rewrite.hpp"
#include "rlx/error.hpp"

namespace rlx::compile {

std::string QuantizedGraph::report_text() const {
  std::string out = fmt::format("quantize: {} matmuls considered\n", report.size());
  for (const auto& e : report)
    out += fmt::format("  %{} {}: {} ({})\n", e.node, ir::op_name(e.op), ir::dtype_name(e.dtype), e.reason);
  if (!propagated.empty()) out += fmt::format("quant_propagate: {} rewrites\n", propagated.size());
  for (const auto& line : propagated) out += "  " + line + "\n";
  return out;
}

namespace {

// The range a quantized activation covers: [lo, hi], widened to hold 0 (so that 0 is exact, as padding and
// ReLU outputs need).
struct Range {
  double lo = 0, hi = 0;
};

// The mean squared error of quantizing `seen` to u8 over [lo, hi] (asymmetric, zero exact), as the int8
// matmul's input quantization does.
double u8_mse(const std::vector<double>& seen, double lo, double hi) {
  const double scale = (hi - lo) / 255;
  if (!(scale > 0)) return 0;
  const double zero = std::nearbyint(-lo / scale);
  double err = 0;
  for (double v : seen) {
    const double q = std::clamp(std::nearbyint(v / scale) + zero, 0.0, 255.0);
    const double d = v - (q - zero) * scale;
    err += d * d;
  }
  return err / double(seen.size());
}

Range calibrated(std::vector<double>& seen, double lo, double hi, const QuantizeOptions& o) {
  if (o.calibration == Calibration::MinMax || seen.empty()) return {std::min(lo, 0.0), std::max(hi, 0.0)};
  if (o.calibration == Calibration::Mse) {
    // Each end in turn (twice) moved toward 0 by a factor in [1/64, 1] (128 steps), keeping the least error:
    // the ends clip different tails, so they move apart.
    Range best{std::min(lo, 0.0), std::max(hi, 0.0)};
    const Range whole = best;
    double least = u8_mse(seen, best.lo, best.hi);
    for (int round = 0; round < 4; ++round) {
      const bool upper = round % 2 == 0;
      const Range start = best;
      for (int i = 1; i < 128; ++i) {
        const double f = std::pow(64.0, -double(i) / 127);
        const Range r = upper ? Range{start.lo, whole.hi * f} : Range{whole.lo * f, start.hi};
        if (const double e = u8_mse(seen, r.lo, r.hi); e < least) least = e, best = r;
      }
    }
    return best;
  }
  // Percentile of |x|: a few outliers must not stretch the scale for everything else.
  for (auto& v : seen) v = std::abs(v);
  const auto k = std::size_t(std::clamp(o.percentile / 100.0, 0.0, 1.0) * double(seen.size() - 1));
  std::nth_element(seen.begin(), seen.begin() + std::ptrdiff_t(k), seen.end());
  const double m = seen[k];
  return {lo < 0 ? -m : 0.0, m};
}

}  // namespace

QuantizedGraph quantize(const ir::Graph& graph, const reference::TensorMap& params,
                        std::span<const reference::TensorMap> batches, const BackendTraits& backend,
                        const QuantizeOptions& options) {
  if (batches.empty()) throw Error("quantize: no calibration batch (give at least one set of the graph's inputs)");
  if (options.calibration == Calibration::Percentile && !(options.percentile > 0 && options.percentile <= 100))
    throw Error(fmt::format("quantize: percentile {} is not in (0, 100]", options.percentile));
  for (auto id : graph.param_ids())
    if (!params.contains(graph.node(id).attrs.get_str("name")))
      throw Error(fmt::format("quantize: param '{}' has no value", graph.node(id).attrs.get_str("name")));
  // Primitives: the matmuls of linears and attention are visible.
  const ir::Graph g = passes::decompose(graph, {});
  QuantizedGraph q;
  q.params = params;
  const bool fast = backend.fast_low_precision.contains({ir::OpKind::MatMul, ir::DType::I8});

  // The candidates: f32 matmuls of an activation by a 2-D param (the weights PTQ can fix).
  std::vector<ir::NodeId> candidates;
  // The int8 candidate whose output, through a bias add and a relu, is this matmul's input: quant_propagate
  // then folds this matmul's quantize into that one's epilogue (the activation is written as u8 and read as
  // stored), so this one pays no quantize of its own.
  auto requantizing_producer = [&](const ir::Node& n) -> std::optional<ir::NodeId> {
    if (!options.propagate) return std::nullopt;
    auto known = [&](ir::NodeId id) {
      const auto op = g.node(id).op;
      return op == ir::OpKind::Param || op == ir::OpKind::Constant;
    };
    ir::NodeId x = n.inputs[0];
    for (;;) {
      const ir::Node& p = g.node(x);
      const bool binary_add = p.op == ir::OpKind::Add && p.inputs.size() == 2;
      if (p.op == ir::OpKind::Relu || (binary_add && known(p.inputs[1]))) {
        x = p.inputs[0];
      } else if (binary_add && known(p.inputs[0])) {
        x = p.inputs[1];
      } else {
        break;
      }
    }
    if (std::find(candidates.begin(), candidates.end(), x) == candidates.end()) return std::nullopt;
    return x;
  };
  std::map<ir::NodeId, ir::NodeId> requantized_by;  // a candidate -> the int8 matmul that requantizes its input
  for (const auto& n : g.nodes()) {
    if (n.op != ir::OpKind::MatMul) continue;
    const auto& b = g.node(n.inputs[1]);
    // The per-row and panel-width thresholds weigh a layer's own quantize (K values a row) against its gain,
    // measured with f32 inputs; a layer whose input arrives requantized skips that cost, and only the total
    // work decides (docs/precision.md).
    const auto producer = requantizing_producer(n);
    std::string why;
    if (n.dtype != ir::DType::F32)
      why = "left as written: not f32";
    else if (b.op != ir::OpKind::Param || b.shape.rank() != 2)
      why = "left in f32: its weights are not a 2-D param";
    else if (!fast)
      why = fmt::format("left in f32: backend '{}' has no int8 matmul faster than its f32 one", backend.name);
    else if (const std::int64_t macs = n.shape.numel() * b.shape[0].size; macs < backend.int8_matmul_min_macs)
      why = fmt::format("left in f32: {} multiply-adds, below the {} at which backend '{}' gains from int8", macs,
                        backend.int8_matmul_min_macs, backend.name);
    else if (const std::int64_t row = b.shape[0].size * b.shape[1].size;
             !producer && row < backend.int8_matmul_min_row_macs)
      why = fmt::format(
          "left in f32: {} multiply-adds a row ({} x {}), below the {} at which backend '{}' gains "
          "from int8 (a row's quantize and dequantize cost more than its products save)",
          row, b.shape[0].size, b.shape[1].size, backend.int8_matmul_min_row_macs, backend.name);
    else if (!producer && b.shape[1].size < backend.int8_matmul_min_n)
      why = fmt::format("left in f32: {} columns, narrower than backend '{}''s int8 panels ({})", b.shape[1].size,
                        backend.name, backend.int8_matmul_min_n);
    if (!why.empty()) {
      q.report.push_back({n.id, n.op, n.dtype, why});
      continue;
    }
    candidates.push_back(n.id);
    if (producer) requantized_by[n.id] = *producer;
  }

  // Calibration: each candidate's activation, as an extra output, over every batch.
  std::map<ir::NodeId, Range> ranges;
  if (!candidates.empty()) {
    ir::Graph probe = g;
    for (auto id : candidates) probe.add_output(g.node(id).inputs[0]);
    const std::size_t first = g.outputs().size();
    std::map<ir::NodeId, std::vector<double>> samples;
    std::map<ir::NodeId, std::pair<double, double>> minmax;
    for (const auto& batch : batches) {
      const auto outs = reference::run(probe, batch, params);
      for (std::size_t c = 0; c < candidates.size(); ++c) {
        const ir::Tensor& t = outs.at(first + c);
        auto& [lo, hi] = minmax
                             .try_emplace(candidates[c], std::numeric_limits<double>::infinity(),
                                          -std::numeric_limits<double>::infinity())
                             .first->second;
        auto& s = samples[candidates[c]];
        // Percentile keeps up to 2^20 values per activation, evenly strided; MSE, which tries 128 ranges on
        // them, 2^16.
        const int keep = options.calibration == Calibration::Mse ? 16 : 20;
        const std::int64_t step = std::max<std::int64_t>(1, t.numel() * std::int64_t(batches.size()) >> keep);
        for (std::int64_t i = 0; i < t.numel(); ++i) {
          const double v = t.get(i);
          if (!std::isfinite(v)) continue;
          lo = std::min(lo, v);
          hi = std::max(hi, v);
          if (options.calibration != Calibration::MinMax && i % step == 0) s.push_back(v);
        }
      }
    }
    for (auto id : candidates) {
      const auto [lo, hi] = minmax.at(id);
      ranges[id] = calibrated(samples[id], std::isfinite(lo) ? lo : 0, std::isfinite(hi) ? hi : 0, options);
    }
  }

  q.graph = rewrite(g, [&](Rewriter& r, const ir::Node& n) -> std::optional<ir::NodeId> {
    const auto it = ranges.find(n.id);
    if (it == ranges.end()) return std::nullopt;
    auto& out = r.out();
    const auto& wn = g.node(n.inputs[1]);
    const std::string wname = wn.attrs.get_str("name");
    const ir::Tensor& w = params.at(wname);
    const std::int64_t K = wn.shape[0].size, N = wn.shape[1].size;
    // Weights: s8 per output channel, symmetric (the scale maps the column's largest |w| to 127).
    ir::Tensor wq(ir::DType::I8, {K, N});
    ir::Tensor wscale(ir::DType::F32, {N}), colsum(ir::DType::F32, {N});
    for (std::int64_t j = 0; j < N; ++j) {
      double m = 0;
      for (std::int64_t k = 0; k < K; ++k) m = std::max(m, std::abs(w.get(k * N + j)));
      const double s = m > 0 ? m / 127 : 1;
      double sum = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double v = std::clamp(std::nearbyint(w.get(k * N + j) / s), -127.0, 127.0);
        wq.set(k * N + j, v);
        sum += v;
      }
      wscale.set(j, s);
      colsum.set(j, sum);
    }
    // Activations: u8 per tensor, asymmetric: x ~ s_x (x_q - zp).
    const auto [lo, hi] = it->second;
    const double sx = hi > lo ? (hi - lo) / 255 : 1;
    const double zp = std::clamp(std::nearbyint(-lo / sx), 0.0, 255.0);
    const std::string qname = wname + ".int8";
    if (q.params.contains(qname)) throw Error(fmt::format("quantize: the graph already has a param '{}'", qname));
    q.params[qname] = wq;
    auto x = r.map(n.inputs[0]);
    auto xq = out.unary(ir::OpKind::Round, out.add(out.mul(x, out.scalar(1 / sx)), out.scalar(zp)));
    xq = out.cast(out.clamp(xq, 0, 255), ir::DType::U8);
    auto acc =
        out.matmul(out.cast(xq, ir::DType::I32), out.cast(out.param(qname, wn.shape, ir::DType::I8), ir::DType::I32));
    // y = s_x s_w[j] (sum_k x_q w_q - zp colsum[j]): the zero point's share, then both scales, per column.
    for (std::int64_t j = 0; j < N; ++j) {
      colsum.set(j, zp * colsum.get(j));
      wscale.set(j, sx * wscale.get(j));
    }
    auto y = out.mul(out.sub(out.cast(acc, ir::DType::F32), out.constant(colsum)), out.constant(wscale));
    const auto by = requantized_by.find(n.id);
    q.report.push_back(
        {n.id, n.op, ir::DType::I8,
         fmt::format("u8 activations in [{:.4g}, {:.4g}] per tensor, s8 weights per channel, i32 "
                     "accumulation, dequantized in its epilogue{}",
                     lo, hi,
                     by == requantized_by.end()
                         ? ""
                         : fmt::format("; its input is requantized to u8 in matmul %{}'s epilogue, so it pays no "
                                       "quantize of its own (the thresholds per row and on width do not apply)",
                                       by->second))});
    return y;
  });
  std::sort(q.report.begin(), q.report.end(), [](const auto& a, const auto& b) { return a.node < b.node; });
  if (options.propagate && !ranges.empty()) q.graph = passes::quant_propagate(q.graph, q.params, &q.propagated);
  // The f32 weights a quantized matmul no longer reads are not params of the new graph (dce keeps every
  // param, as the calling interface; here the interface changes on purpose).
  {
    const ir::Graph& full = q.graph;
    std::vector<bool> live(full.size(), false);
    for (auto id : full.output_ids()) live[id] = true;
    for (auto id = full.size(); id-- > 0;) {
      const auto& n = full.node(ir::NodeId(id));
      if (n.op == ir::OpKind::Input) live[id] = true;
      if (live[id])
        for (auto i : n.inputs) live[i] = true;
    }
    Rewriter pruned(full);
    for (const auto& n : full.nodes())
      if (live[n.id]) pruned.copy(n);
    q.graph = pruned.finish();
  }
  reference::TensorMap used;
  for (auto id : q.graph.param_ids()) {
    const auto& name = q.graph.node(id).attrs.get_str("name");
    used[name] = q.params.at(name);
  }
  q.params = std::move(used);
  return q;
}

}  // namespace rlx::compile
