// Op sharding: the cuts of matmul, conv, elementwise ops and attention, their bytes, and the choice between
// running the pieces on workers and running the op whole (rlx/compile/shard.hpp, docs/compile.md).
#include "rlx/compile/shard.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <numeric>

#include "rlx/error.hpp"
#include "rlx/ir/op_def.hpp"

namespace rlx::compile::shard {

std::vector<Range> split_extent(std::int64_t extent, int n) {
  if (n < 1) throw Error(fmt::format("shard: cannot cut into {} pieces (n must be at least 1)", n));
  if (extent < 0) throw Error(fmt::format("shard: cannot cut an axis of negative length {}", extent));
  const std::int64_t pieces = std::min<std::int64_t>(n, extent);
  std::vector<Range> out;
  out.reserve(std::size_t(pieces));
  std::int64_t start = 0;
  for (std::int64_t p = 0; p < pieces; ++p) {
    const std::int64_t len = extent / pieces + (p < extent % pieces ? 1 : 0);
    out.push_back({start, len});
    start += len;
  }
  return out;
}

std::string_view cut_name(Cut c) {
  switch (c) {
    case Cut::Rows: return "rows";
    case Cut::Columns: return "columns";
    case Cut::Reduction: return "reduction";
    case Cut::Batch: return "batch";
    case Cut::OutChannels: return "out_channels";
    case Cut::Heads: return "heads";
    case Cut::Axis: return "axis";
  }
  return "?";
}

namespace {

std::string operand_name(ir::OpKind op, std::size_t i) {
  const auto& names = ir::op_def(op).operands;
  if (i >= names.size()) return fmt::format("operand {}", i);
  std::string s(names[i]);
  if (!s.empty() && s.back() == '?') s.pop_back();
  return s;
}

std::string lengths(const std::vector<Range>& rs) {
  std::string s;
  for (const auto& r : rs) s += (s.empty() ? "" : ",") + std::to_string(r.length);
  return s;
}

}  // namespace

std::string ShardOption::describe() const {
  std::string s =
      fmt::format("{} %{} by {} into {} ({})", ir::op_name(op), node, cut_name(cut), pieces(), lengths(ranges));
  for (std::size_t i = 0; i < operands.size(); ++i) {
    const auto& o = operands[i];
    s += i ? ", " : ": ";
    s += operand_name(op, o.operand);
    s += o.shared() ? std::string(" shared") : fmt::format(" sliced on axis {}", *o.axis);
  }
  s += recombine == Recombine::Sum ? std::string("; summed") : fmt::format("; concat on axis {}", output_axis);
  return s;
}

namespace {

using Extents = std::vector<std::int64_t>;

std::int64_t tensor_bytes(const ir::Node& n) { return std::int64_t(ir::storage_bytes(n.dtype, n.shape.extents())); }

// The node, its operands' and its own extents, checked to be static.
struct Site {
  const ir::Graph& g;
  const ir::Node& n;
  std::vector<Extents> in;  // each operand's extents
  Extents out;

  const ir::Node& input(std::size_t i) const { return g.node(n.inputs[i]); }
};

// Builds one option: every operand shared unless slice() says otherwise, then finish() fills the costs.
class OptionBuilder {
 public:
  OptionBuilder(const Site& site, Cut cut, std::int64_t extent, std::vector<Range> ranges) : site_(site) {
    o_.node = site.n.id;
    o_.op = site.n.op;
    o_.cut = cut;
    o_.extent = extent;
    o_.ranges = std::move(ranges);
    for (std::size_t i = 0; i < site.n.inputs.size(); ++i) o_.operands.push_back({i, std::nullopt, {}, 0});
  }
  OptionBuilder& slice(std::size_t operand, std::int64_t axis) { return slice(operand, axis, o_.ranges); }
  OptionBuilder& slice(std::size_t operand, std::int64_t axis, std::vector<Range> ranges) {
    assert(operand < o_.operands.size() && ranges.size() == o_.ranges.size());
    o_.operands[operand].axis = axis;
    o_.operands[operand].ranges = std::move(ranges);
    return *this;
  }
  // The result: concatenated along `axis`, or summed (nullopt). FLOPs split in proportion to the pieces.
  // Called once: the option is moved out.
  ShardOption finish(std::optional<std::int64_t> output_axis, double whole_flops) {
    const std::size_t pieces = o_.ranges.size();
    o_.recombine = output_axis ? Recombine::Concat : Recombine::Sum;
    o_.output_axis = output_axis.value_or(0);
    o_.whole_flops = whole_flops;
    o_.sliced_bytes.assign(pieces, 0);
    for (auto& oc : o_.operands) {
      oc.bytes = tensor_bytes(site_.input(oc.operand));
      if (oc.shared()) {
        o_.shared_bytes += oc.bytes;
        continue;
      }
      const std::int64_t along = site_.in[oc.operand][std::size_t(*oc.axis)];
      for (std::size_t p = 0; p < pieces; ++p) o_.sliced_bytes[p] += oc.bytes / along * oc.ranges[p].length;
    }
    const std::int64_t out_bytes = tensor_bytes(site_.n);
    for (const auto& r : o_.ranges) {
      o_.flops.push_back(whole_flops * double(r.length) / double(o_.extent));
      o_.result_bytes.push_back(output_axis ? out_bytes / site_.out[std::size_t(*output_axis)] * r.length : out_bytes);
    }
    return std::move(o_);
  }

 private:
  const Site& site_;
  ShardOption o_;
};

double node_flops(const Site& s) {
  std::vector<ir::TypeInfo> in;
  for (std::size_t i = 0; i < s.n.inputs.size(); ++i) in.push_back({s.input(i).dtype, s.input(i).shape});
  return ir::op_flops(s.n.op, in, {s.n.dtype, s.n.shape});
}

std::int64_t product(const Extents& e, std::size_t from = 0) {
  std::int64_t p = 1;
  for (std::size_t i = from; i < e.size(); ++i) p *= e[i];
  return p;
}

void matmul_options(const Site& s, int n, std::vector<ShardOption>& out) {
  const Extents &a = s.in[0], &b = s.in[1];
  const std::int64_t ra = std::int64_t(a.size()), rb = std::int64_t(b.size()), ro = std::int64_t(s.out.size());
  const std::int64_t M = a[std::size_t(ra - 2)], K = a[std::size_t(ra - 1)], N = b[std::size_t(rb - 1)];
  const double flops = node_flops(s);
  if (auto rs = split_extent(M, n); rs.size() >= 2)
    out.push_back(OptionBuilder(s, Cut::Rows, M, rs).slice(0, ra - 2).finish(ro - 2, flops));
  if (auto rs = split_extent(N, n); rs.size() >= 2)
    out.push_back(OptionBuilder(s, Cut::Columns, N, rs).slice(1, rb - 1).finish(ro - 1, flops));
  if (auto rs = split_extent(K, n); rs.size() >= 2)
    out.push_back(
        OptionBuilder(s, Cut::Reduction, K, rs).slice(0, ra - 1).slice(1, rb - 2).finish(std::nullopt, flops));
}

// x [N, C, spatial..], w [O, C/groups, kernel..], b [O].
void conv_options(const Site& s, int n, std::vector<ShardOption>& out) {
  const Extents &x = s.in[0], &w = s.in[1];
  // Each output element: a multiply-add per weight of its group, plus the bias.
  const double flops = double(product(s.out)) * (2.0 * double(product(w, 1)) + (s.in.size() > 2 ? 1.0 : 0.0));
  if (auto rs = split_extent(x[0], n); rs.size() >= 2)
    out.push_back(OptionBuilder(s, Cut::Batch, x[0], rs).slice(0, 0).finish(0, flops));
  // With groups > 1 a piece of output channels reads only its groups' input channels, and runs with fewer
  // groups: not offered yet.
  if (s.n.attrs.int_or("groups", 1) != 1) return;
  if (auto rs = split_extent(w[0], n); rs.size() >= 2) {
    OptionBuilder b(s, Cut::OutChannels, w[0], rs);
    b.slice(1, 0);
    if (s.in.size() > 2) b.slice(2, 0);
    out.push_back(b.finish(1, flops));
  }
}

// q [B, H, Sq, D], k, v [B, Hkv, Sk, D(v)], mask broadcasting to [B, H, Sq, Sk].
void attention_options(const Site& s, int n, std::vector<ShardOption>& out) {
  const Extents &q = s.in[0], &k = s.in[1], &v = s.in[2];
  const std::int64_t B = q[0], H = q[1], Hkv = k[1], Sq = q[2], Sk = k[2], D = q[3], Dv = v[3];
  const double flops = double(B * H) * double(Sq * Sk) * double(2 * D + 2 * Dv + 5);
  const bool has_mask = s.in.size() > 3;
  const Extents mask = has_mask ? s.in[3] : Extents{};
  const auto mr = std::int64_t(mask.size());
  // The mask's axis aligned with the scores' axis `axis` of 4, when it has one of length > 1.
  auto mask_axis = [&](std::int64_t axis) -> std::optional<std::int64_t> {
    const std::int64_t m = axis - (4 - mr);
    if (!has_mask || m < 0 || mask[std::size_t(m)] == 1) return std::nullopt;
    return m;
  };
  // Heads: whole kv groups when there are at least n kv heads, so that k and v are cut disjointly; otherwise
  // the query heads, each piece reading the kv heads that serve them.
  const std::int64_t group = H / Hkv;
  std::vector<Range> qr, kvr;
  if (Hkv >= n) {
    kvr = split_extent(Hkv, n);
    for (const auto& r : kvr) qr.push_back({r.start * group, r.length * group});
  } else {
    qr = split_extent(H, n);
    for (const auto& r : qr) {
      const std::int64_t first = r.start / group, last = (r.end() - 1) / group;
      kvr.push_back({first, last - first + 1});
    }
  }
  if (qr.size() >= 2) {
    OptionBuilder b(s, Cut::Heads, H, qr);
    b.slice(0, 1).slice(1, 1, kvr).slice(2, 1, kvr);
    if (auto m = mask_axis(1)) b.slice(3, *m);
    out.push_back(b.finish(1, flops));
  }
  if (auto rs = split_extent(B, n); rs.size() >= 2) {
    OptionBuilder b(s, Cut::Batch, B, rs);
    b.slice(0, 0).slice(1, 0).slice(2, 0);
    if (auto m = mask_axis(0)) b.slice(3, *m);
    out.push_back(b.finish(0, flops));
  }
}

// Any output axis; an operand is sliced where it has that axis at full length (right-aligned, as NumPy
// broadcasts) and shared where it is broadcast along it.
void elementwise_options(const Site& s, int n, std::vector<ShardOption>& out) {
  const double flops = node_flops(s);
  const auto ro = std::int64_t(s.out.size());
  for (std::int64_t axis = 0; axis < ro; ++axis) {
    const std::int64_t extent = s.out[std::size_t(axis)];
    auto rs = split_extent(extent, n);
    if (rs.size() < 2) continue;
    OptionBuilder b(s, Cut::Axis, extent, rs);
    for (std::size_t i = 0; i < s.in.size(); ++i) {
      const std::int64_t at = axis - (ro - std::int64_t(s.in[i].size()));
      if (at >= 0 && s.in[i][std::size_t(at)] == extent) b.slice(i, at);
    }
    out.push_back(b.finish(axis, flops));
  }
}

}  // namespace

std::vector<ShardOption> shardings(const ir::Graph& graph, ir::NodeId node, int n) {
  if (node >= graph.size())
    throw Error(
        fmt::format("shard: node %{} is out of range (graph '{}' has {} nodes)", node, graph.name(), graph.size()));
  const ir::Node& nd = graph.node(node);
  if (n < 1)
    throw Error(
        fmt::format("shard: {}: cannot cut into {} pieces (n must be at least 1)", ir::describe_node(graph, nd), n));
  Site s{graph, nd, {}, {}};
  const auto static_extents = [&](const ir::Node& x) {
    if (!x.shape.is_static())
      throw Error(fmt::format("shard: {}: {} has symbolic dims {}; bind them first", ir::describe_node(graph, nd),
                              x.id == nd.id ? std::string("the result") : fmt::format("operand %{}", x.id),
                              x.shape.str()));
    return x.shape.extents();
  };
  for (auto i : nd.inputs) s.in.push_back(static_extents(graph.node(i)));
  s.out = static_extents(nd);

  std::vector<ShardOption> out;
  if (nd.op == ir::OpKind::MatMul)
    matmul_options(s, n, out);
  else if (nd.op == ir::OpKind::Conv1d || nd.op == ir::OpKind::Conv2d)
    conv_options(s, n, out);
  else if (nd.op == ir::OpKind::Attention)
    attention_options(s, n, out);
  else if (ir::is_elementwise(nd.op))
    elementwise_options(s, n, out);
  return out;
}

// ---- choosing ----

namespace {

struct Priced {
  double seconds = std::numeric_limits<double>::infinity();
  std::vector<PieceRun> runs;
};

// Greedy list scheduling: pieces largest first, each to the worker that finishes it soonest.
Priced price(const ShardOption& o, std::span<const WorkerCost> workers, const std::vector<std::size_t>& usable,
             LinkCost link, Residency residency) {
  Priced p;
  if (usable.empty() || o.pieces() == 0) return p;
  std::vector<std::size_t> order(o.pieces());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return o.flops[a] > o.flops[b]; });
  std::vector<double> busy(workers.size(), 0);
  std::vector<bool> has_shared(workers.size(), false);
  p.runs.resize(o.pieces());
  for (std::size_t piece : order) {
    PieceRun best;
    double best_end = std::numeric_limits<double>::infinity();
    for (std::size_t w : usable) {
      const WorkerCost& wc = workers[w];
      PieceRun r{piece, w, o.flops[piece] / wc.flops_per_s, 0};
      if (!wc.local) {
        double bytes = double(o.sliced_bytes[piece] + o.result_bytes[piece]);
        if (!residency.shared_resident && !has_shared[w]) bytes += double(o.shared_bytes);
        r.transfer_s = link.latency_s + bytes / link.bytes_per_s;
      }
      const double end = busy[w] + r.compute_s + r.transfer_s;
      if (end < best_end) best_end = end, best = r;
    }
    busy[best.worker] = best_end;
    has_shared[best.worker] = true;
    p.runs[piece] = best;
  }
  p.seconds = *std::max_element(busy.begin(), busy.end());
  return p;
}

std::string worker_list(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

std::string secs(double s) {
  if (s < 1e-6) return fmt::format("{:.3g} ns", s * 1e9);
  if (s < 1e-3) return fmt::format("{:.3g} us", s * 1e6);
  if (s < 1) return fmt::format("{:.3g} ms", s * 1e3);
  return fmt::format("{:.3g} s", s);
}

}  // namespace

std::optional<Choice> choose(std::span<const ShardOption> options, std::span<const WorkerCost> workers, LinkCost link,
                             Residency residency, double local_rate, ChoiceReport* report) {
  if (!(local_rate > 0) || !std::isfinite(local_rate))
    throw Error(fmt::format("shard::choose: local_rate must be a positive FLOP rate, got {}", local_rate));
  if (!(link.bytes_per_s > 0) || !(link.latency_s >= 0))
    throw Error(
        fmt::format("shard::choose: the link needs a positive bandwidth and a latency >= 0, got {} B/s and {} s",
                    link.bytes_per_s, link.latency_s));
  ChoiceReport rep;
  std::vector<std::size_t> usable;
  for (std::size_t w = 0; w < workers.size(); ++w) {
    const WorkerCost& wc = workers[w];
    if (!wc.rankable)
      rep.excluded.push_back({wc.name, "its cost model is not rankable (CostCalibration::is_rankable)"});
    else if (!(wc.flops_per_s > 0) || !std::isfinite(wc.flops_per_s))
      rep.excluded.push_back({wc.name, fmt::format("its FLOP rate {} is not a positive number", wc.flops_per_s)});
    else
      usable.push_back(w);
  }
  const double whole_flops = options.empty() ? 0 : options.front().whole_flops;
  rep.whole_s = whole_flops / local_rate;

  std::optional<std::size_t> best;
  Priced best_priced;
  for (std::size_t i = 0; i < options.size(); ++i) {
    Priced p = price(options[i], workers, usable, link, residency);
    rep.option_s.push_back(p.seconds);
    if (p.seconds < best_priced.seconds) best = i, best_priced = std::move(p);
  }

  std::optional<Choice> choice;
  if (options.empty())
    rep.why = "run whole: no options";
  else if (usable.empty())
    rep.why = "run whole: no usable workers";
  else if (!(best_priced.seconds < rep.whole_s))
    rep.why = fmt::format("run whole: {} locally beats the best split ({}, {})", secs(rep.whole_s),
                          options[*best].describe(), secs(best_priced.seconds));
  else {
    Choice c;
    c.option_index = *best;
    c.option = options[*best];
    c.split_s = best_priced.seconds;
    c.whole_s = rep.whole_s;
    std::vector<bool> used(workers.size(), false);
    for (const auto& r : best_priced.runs) used[r.worker] = true;
    for (std::size_t w = 0; w < workers.size(); ++w)
      if (used[w]) c.workers.push_back(workers[w].name);
    c.runs = std::move(best_priced.runs);
    c.excluded = rep.excluded;
    rep.why = c.why = fmt::format("split: {}; on {}: {} against {} whole", c.option.describe(), worker_list(c.workers),
                                  secs(c.split_s), secs(c.whole_s));
    choice = std::move(c);
  }
  if (report) *report = std::move(rep);
  return choice;
}

}  // namespace rlx::compile::shard
