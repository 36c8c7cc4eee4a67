// compile::shard: ranges that cover their axis exactly; every option run the way a worker would be fed it
// (only its slice, as its own graph on the CPU backend) and recombined on the host, against the op run whole;
// choose on synthetic costs (a split that wins, a tiny op that stays whole, the residency flip, a worker that
// is not rankable); bad input.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>

#include "rlx/compile/shard.hpp"
#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

using compile::shard::ChoiceReport;
using compile::shard::choose;
using compile::shard::Cut;
using compile::shard::LinkCost;
using compile::shard::Range;
using compile::shard::Recombine;
using compile::shard::Residency;
using compile::shard::shardings;
using compile::shard::ShardOption;
using compile::shard::split_extent;
using compile::shard::WorkerCost;
using ir::DType;
using ir::Graph;
using ir::NodeId;
using ir::OpKind;
using ir::Tensor;
using Ints = std::vector<std::int64_t>;

// Contiguous from 0, disjoint, covering [0, extent), lengths within one of each other.
::testing::AssertionResult covers(const std::vector<Range>& rs, std::int64_t extent) {
  std::int64_t at = 0, lo = extent, hi = 0;
  for (const auto& r : rs) {
    if (r.start != at || r.length < 1)
      return ::testing::AssertionFailure() << "range [" << r.start << "," << r.end() << ") after " << at;
    at = r.end();
    lo = std::min(lo, r.length), hi = std::max(hi, r.length);
  }
  if (at != extent) return ::testing::AssertionFailure() << "ranges end at " << at << ", not " << extent;
  if (!rs.empty() && hi - lo > 1) return ::testing::AssertionFailure() << "lengths " << lo << " to " << hi;
  return ::testing::AssertionSuccess();
}

TEST(Shard, RangesAreContiguousDisjointAndCovering) {
  for (std::int64_t extent = 0; extent <= 70; ++extent)
    for (int n = 1; n <= 13; ++n) {
      auto rs = split_extent(extent, n);
      EXPECT_EQ(std::int64_t(rs.size()), std::min<std::int64_t>(n, extent)) << extent << " into " << n;
      EXPECT_TRUE(covers(rs, extent)) << extent << " into " << n;
    }
  EXPECT_EQ(split_extent(10, 4), (std::vector<Range>{{0, 3}, {3, 3}, {6, 2}, {8, 2}}));
  testing::expect_error([] { (void)split_extent(5, 0); }, {"at least 1"});
  testing::expect_error([] { (void)split_extent(-1, 2); }, {"negative"});
}

// ---- shard equivalence -------------------------------------------------------------------------------------

// One op over inputs in0, in1, ..., and their values.
struct OpCase {
  std::string name;
  Graph g;
  NodeId node = 0;
  std::vector<Tensor> inputs;
};

std::map<std::string, Tensor, std::less<>> feeds(const std::vector<Tensor>& ts) {
  std::map<std::string, Tensor, std::less<>> m;
  for (std::size_t i = 0; i < ts.size(); ++i) m.emplace("in" + std::to_string(i), ts[i]);
  return m;
}

Tensor run_cpu(const Graph& g, const std::vector<Tensor>& inputs) {
  auto compiled = Session(Device::Cpu).compile(g);
  auto out = compiled.run(feeds(inputs));
  return out.at(0);
}

// t[..., r, ...] along `axis`, copied on the host.
Tensor narrow(const Tensor& t, std::int64_t axis, Range r) {
  const auto& shape = t.shape();
  const std::size_t esize = ir::dtype_size(t.dtype());
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t i = 0; i < axis; ++i) outer *= shape[std::size_t(i)];
  for (std::size_t i = std::size_t(axis) + 1; i < shape.size(); ++i) inner *= shape[i];
  Ints to = shape;
  to[std::size_t(axis)] = r.length;
  Tensor out(t.dtype(), to);
  const std::size_t row = std::size_t(inner) * esize, along = std::size_t(shape[std::size_t(axis)]);
  for (std::int64_t o = 0; o < outer; ++o)
    std::memcpy(out.data() + std::size_t(o) * std::size_t(r.length) * row,
                t.data() + (std::size_t(o) * along + std::size_t(r.start)) * row, std::size_t(r.length) * row);
  return out;
}

Tensor concat(const std::vector<Tensor>& parts, std::int64_t axis) {
  Ints shape = parts.front().shape();
  shape[std::size_t(axis)] = 0;
  for (const auto& p : parts) shape[std::size_t(axis)] += p.shape()[std::size_t(axis)];
  Tensor out(parts.front().dtype(), shape);
  const std::size_t esize = ir::dtype_size(out.dtype());
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t i = 0; i < axis; ++i) outer *= shape[std::size_t(i)];
  for (std::size_t i = std::size_t(axis) + 1; i < shape.size(); ++i) inner *= shape[i];
  std::byte* dst = out.data();
  for (std::int64_t o = 0; o < outer; ++o)
    for (const auto& p : parts) {
      const std::size_t n = std::size_t(p.shape()[std::size_t(axis)] * inner) * esize;
      std::memcpy(dst, p.data() + std::size_t(o) * n, n);
      dst += n;
    }
  return out;
}

Tensor sum(const std::vector<Tensor>& parts) {
  Tensor out = parts.front();
  for (std::size_t p = 1; p < parts.size(); ++p)
    for (std::int64_t i = 0; i < out.numel(); ++i) out.data_as<float>()[i] += parts[p].data_as<float>()[i];
  return out;
}

// Runs every piece of `o` as its own graph, fed only its slices, and recombines the results.
Tensor run_sharded(const OpCase& c, const ShardOption& o) {
  const ir::Node& node = c.g.node(c.node);
  std::vector<Tensor> results;
  for (std::size_t p = 0; p < o.pieces(); ++p) {
    Graph piece("piece" + std::to_string(p));
    std::vector<NodeId> ins;
    std::vector<Tensor> slices;
    for (const auto& oc : o.operands) {
      const Tensor& whole = c.inputs[oc.operand];
      slices.push_back(oc.shared() ? whole : narrow(whole, *oc.axis, oc.ranges[p]));
      ins.push_back(piece.input("in" + std::to_string(oc.operand), ir::Shape(slices.back().shape()), whole.dtype()));
    }
    piece.add_output(piece.add(node.op, ins, node.attrs), "y");
    results.push_back(run_cpu(piece, slices));
  }
  return o.recombine == Recombine::Sum ? sum(results) : concat(results, o.output_axis);
}

// |got - want| <= rel * (|want| + max |want|), elementwise: relative to the tensor's scale.
::testing::AssertionResult close(const Tensor& got, const Tensor& want, double rel) {
  double scale = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) scale = std::max(scale, std::fabs(want.get(i)));
  return testing::tensors_close(got, want, {rel * scale, rel});
}

// The option's ranges and each sliced operand's against the shapes they cut.
void check_ranges(const OpCase& c, const ShardOption& o) {
  const ir::Node& node = c.g.node(c.node);
  EXPECT_TRUE(covers(o.ranges, o.extent)) << o.describe();
  if (o.recombine == Recombine::Concat) {
    EXPECT_EQ(node.shape[std::size_t(o.output_axis)].size, o.extent);
  }
  ASSERT_EQ(o.operands.size(), node.inputs.size());
  ASSERT_EQ(o.flops.size(), o.pieces());
  for (const auto& oc : o.operands) {
    if (oc.shared()) continue;
    ASSERT_EQ(oc.ranges.size(), o.pieces()) << o.describe();
    const std::int64_t along = c.inputs[oc.operand].shape()[std::size_t(*oc.axis)];
    const bool kv_under_gqa =
        o.cut == Cut::Heads && (oc.operand == 1 || oc.operand == 2) && c.inputs[1].shape()[1] != c.inputs[0].shape()[1];
    if (!kv_under_gqa) {
      EXPECT_TRUE(covers(oc.ranges, along)) << o.describe();
      continue;
    }
    // A piece of query heads reads exactly the kv heads serving them: each kv head at least once, in order.
    const std::int64_t group = c.inputs[0].shape()[1] / along;
    for (std::size_t p = 0; p < o.pieces(); ++p) {
      EXPECT_EQ(oc.ranges[p].start, o.ranges[p].start / group);
      EXPECT_EQ(oc.ranges[p].end(), (o.ranges[p].end() - 1) / group + 1);
    }
    EXPECT_EQ(oc.ranges.front().start, 0);
    EXPECT_EQ(oc.ranges.back().end(), along);
  }
  double total = 0;
  for (double f : o.flops) total += f;
  EXPECT_NEAR(total, o.whole_flops, 1e-9 * o.whole_flops);
}

// Runs every option of `c` for each n against the whole op: bit-identical for the cuts that compute each output
// element exactly as the whole op does, within 1e-6 for columns, out-channels and heads, 1e-5 for K. Matmul rows
// are bit-identical only where every piece takes the whole op's GEMM (`exact_rows`): the CPU picks its packed
// GEMM or OpenBLAS by shape, and the two round differently.
void expect_equivalent(const OpCase& c, std::initializer_list<int> ns, std::initializer_list<Cut> expected_cuts,
                       bool exact_rows = true) {
  SCOPED_TRACE(c.name);
  const Tensor whole = run_cpu(c.g, c.inputs);
  for (int n : ns) {
    auto options = shardings(c.g, c.node, n);
    std::vector<Cut> cuts;
    for (const auto& o : options) cuts.push_back(o.cut);
    for (Cut want : expected_cuts)
      EXPECT_NE(std::find(cuts.begin(), cuts.end(), want), cuts.end())
          << "no " << compile::shard::cut_name(want) << " option for n = " << n;
    for (const auto& o : options) {
      SCOPED_TRACE(o.describe());
      check_ranges(c, o);
      const Tensor got = run_sharded(c, o);
      switch (o.cut) {
        case Cut::Rows:
          if (!exact_rows) {
            EXPECT_TRUE(close(got, whole, 1e-6));
            break;
          }
          [[fallthrough]];
        case Cut::Batch:
        case Cut::Axis: EXPECT_TRUE(got == whole) << testing::tensors_close(got, whole, {0, 0}).message(); break;
        case Cut::Columns:
        case Cut::OutChannels:
        case Cut::Heads: EXPECT_TRUE(close(got, whole, 1e-6)); break;
        case Cut::Reduction: EXPECT_TRUE(close(got, whole, 1e-5)); break;
      }
    }
  }
}

class ShardEquivalence : public ::testing::Test {
 protected:
  std::mt19937_64 rng{testing::test_seed()};

  // An op case whose inputs are in0.. of these shapes and dtypes, random.
  OpCase make(std::string name, const std::vector<std::pair<Ints, DType>>& ins,
              const std::function<NodeId(Graph&, const std::vector<NodeId>&)>& op) {
    OpCase c{std::move(name), Graph("whole"), 0, {}};
    std::vector<NodeId> ids;
    for (std::size_t i = 0; i < ins.size(); ++i) {
      ids.push_back(c.g.input("in" + std::to_string(i), ir::Shape(ins[i].first), ins[i].second));
      c.inputs.push_back(testing::random_tensor(ins[i].second, ins[i].first, rng));
    }
    c.node = op(c.g, ids);
    c.g.add_output(c.node, "y");
    return c;
  }
};

TEST_F(ShardEquivalence, Matmul) {
  const auto mm = [](Graph& g, const std::vector<NodeId>& x) { return g.matmul(x[0], x[1]); };
  const std::vector<std::pair<Ints, Ints>> shapes = {
      {{7, 5}, {5, 9}},           {{64, 48}, {48, 40}},      {{96, 200}, {200, 72}},
      {{3, 10, 16}, {3, 16, 12}}, {{2, 1, 6, 8}, {3, 8, 5}},
  };
  for (const auto& [a, b] : shapes) {
    auto c = make("matmul " + ir::Shape(a).str() + " x " + ir::Shape(b).str(), {{a, DType::F32}, {b, DType::F32}}, mm);
    // By shape, a piece of fewer rows may go to OpenBLAS where the whole op took the packed GEMM.
    expect_equivalent(c, {2, 3, 4}, {Cut::Rows, Cut::Columns, Cut::Reduction}, /*exact_rows=*/false);
    // With RLX's packed GEMM for every shape, rows come back bit-identical: each element of C is accumulated
    // over K in the same order whatever M is. (OpenBLAS, pinned with RLX_CPU_GEMM=blas, is not: its kernels for
    // the rows left over at the edge of a tile round differently.)
    SCOPED_TRACE("RLX_CPU_GEMM=packed");
    env::ScopedOverride pin("RLX_CPU_GEMM", "packed");
    expect_equivalent(c, {2, 3, 4}, {Cut::Rows, Cut::Columns, Cut::Reduction});
  }
}

TEST_F(ShardEquivalence, Conv) {
  auto c2 = make("conv2d with bias", {{{4, 3, 9, 9}, DType::F32}, {{6, 3, 3, 3}, DType::F32}, {{6}, DType::F32}},
                 [](Graph& g, const std::vector<NodeId>& x) {
                   return g.conv2d(x[0], x[1], x[2], {2, 1}, {1, 1});
                 });
  expect_equivalent(c2, {2, 3, 4}, {Cut::Batch, Cut::OutChannels});
  auto c1 = make("conv1d", {{{3, 4, 11}, DType::F32}, {{5, 4, 3}, DType::F32}},
                 [](Graph& g, const std::vector<NodeId>& x) { return g.conv1d(x[0], x[1], std::nullopt, 1, 1); });
  expect_equivalent(c1, {2, 3}, {Cut::Batch, Cut::OutChannels});
  // Groups > 1: the batch only.
  auto grouped = make("conv2d groups=2", {{{2, 4, 5, 5}, DType::F32}, {{4, 2, 3, 3}, DType::F32}},
                      [](Graph& g, const std::vector<NodeId>& x) {
                        return g.conv2d(x[0], x[1], std::nullopt, {1, 1}, {0, 0}, {1, 1}, 2);
                      });
  expect_equivalent(grouped, {2}, {Cut::Batch});
  for (const auto& o : shardings(grouped.g, grouped.node, 2)) EXPECT_EQ(o.cut, Cut::Batch);
}

TEST_F(ShardEquivalence, ElementwiseWithBroadcasting) {
  auto add = make("add", {{{4, 1, 6}, DType::F32}, {{5, 1}, DType::F32}},
                  [](Graph& g, const std::vector<NodeId>& x) { return g.add(x[0], x[1]); });
  expect_equivalent(add, {2, 3, 7}, {Cut::Axis});
  EXPECT_EQ(shardings(add.g, add.node, 2).size(), 3u);  // one per output axis
  // Along axis 1 the first operand is broadcast (shared); along axis 0 the second has no such axis (shared).
  for (const auto& o : shardings(add.g, add.node, 2)) {
    EXPECT_EQ(o.operands[0].shared(), o.output_axis == 1) << o.describe();
    EXPECT_EQ(o.operands[1].shared(), o.output_axis != 1) << o.describe();
  }
  auto where = make("where", {{{4, 5, 1}, DType::Bool}, {{5, 6}, DType::F32}, {{4, 5, 6}, DType::F32}},
                    [](Graph& g, const std::vector<NodeId>& x) { return g.where(x[0], x[1], x[2]); });
  expect_equivalent(where, {2, 3}, {Cut::Axis});
  auto mul = make("mul by a scalar", {{{9, 8}, DType::F32}, {{}, DType::F32}},
                  [](Graph& g, const std::vector<NodeId>& x) { return g.mul(x[0], x[1]); });
  expect_equivalent(mul, {4}, {Cut::Axis});
}

TEST_F(ShardEquivalence, AttentionWithGqaAndMask) {
  // 4 query heads over 2 kv heads; a float mask with a head axis (sliced), a bool mask without (shared).
  auto gqa = make(
      "attention gqa, float mask",
      {{{2, 4, 5, 8}, DType::F32}, {{2, 2, 7, 8}, DType::F32}, {{2, 2, 7, 8}, DType::F32}, {{1, 4, 5, 7}, DType::F32}},
      [](Graph& g, const std::vector<NodeId>& x) { return g.attention(x[0], x[1], x[2], x[3]); });
  expect_equivalent(gqa, {2, 3, 4}, {Cut::Heads, Cut::Batch});
  for (const auto& o : shardings(gqa.g, gqa.node, 2)) {
    if (o.cut == Cut::Heads) {
      EXPECT_EQ(o.operands[1].ranges, (std::vector<Range>{{0, 1}, {1, 1}}));  // whole kv groups: k cut disjointly
      EXPECT_EQ(o.operands[3].axis, std::optional<std::int64_t>(1));
    } else {
      EXPECT_TRUE(o.operands[3].shared());  // the mask is broadcast along the batch
    }
  }
  auto bool_mask =
      make("attention gqa, bool mask, causal",
           {{{1, 6, 4, 8}, DType::F32}, {{1, 2, 4, 8}, DType::F32}, {{1, 2, 4, 8}, DType::F32}, {{4, 4}, DType::Bool}},
           [](Graph& g, const std::vector<NodeId>& x) { return g.attention(x[0], x[1], x[2], x[3], /*causal=*/true); });
  for (std::int64_t i = 0; i < 16; ++i) bool_mask.inputs[3].set(i, i % 4 != 1);
  expect_equivalent(bool_mask, {2, 4, 5}, {Cut::Heads});
  for (const auto& o : shardings(bool_mask.g, bool_mask.node, 4)) EXPECT_TRUE(o.operands[3].shared());
}

// ---- bytes and bad input -----------------------------------------------------------------------------------

TEST(Shard, BytesFollowWhatEachCutReplicates) {
  Graph g;
  auto x = g.input("x", {8, 4, 10, 10});
  auto w = g.param("w", {16, 4, 3, 3});
  auto b = g.param("b", {16});
  auto y = g.conv2d(x, w, b);
  const std::int64_t xb = 8 * 4 * 100 * 4, wb = 16 * 4 * 9 * 4, bb = 16 * 4, yb = 8 * 16 * 64 * 4;
  auto options = shardings(g, y, 4);
  ASSERT_EQ(options.size(), 2u);
  for (const auto& o : options) {
    std::int64_t sliced = 0, result = 0;
    for (auto s : o.sliced_bytes) sliced += s;
    for (auto r : o.result_bytes) result += r;
    EXPECT_EQ(result, yb);
    if (o.cut == Cut::Batch) {
      EXPECT_EQ(sliced, xb);
      EXPECT_EQ(o.shared_bytes, wb + bb);  // a batch split replicates the weights
    } else {
      EXPECT_EQ(o.cut, Cut::OutChannels);
      EXPECT_EQ(sliced, wb + bb);
      EXPECT_EQ(o.shared_bytes, xb);  // an out-channel split replicates the activations
    }
    EXPECT_NE(o.describe().find("conv2d %3 by"), std::string::npos) << o.describe();
  }
  // A K split sends every piece the whole result's shape back.
  Graph m;
  auto mm = m.matmul(m.input("a", {4, 6}), m.input("b", {6, 5}));
  for (const auto& o : shardings(m, mm, 3)) {
    if (o.cut == Cut::Reduction) {
      EXPECT_EQ(o.result_bytes, (std::vector<std::int64_t>{80, 80, 80}));
    }
  }
}

TEST(Shard, BadInputAndOpsWithoutShardings) {
  Graph g("bad");
  auto x = g.input("x", {4, 6});
  auto s = g.softmax(x);
  auto r = g.sum(x, {1});
  auto one = g.matmul(g.input("row", {1, 6}), g.input("col", {6, 1}));
  testing::expect_error([&] { (void)shardings(g, 99, 2); }, {"node %99", "out of range", "'bad'"});
  testing::expect_error([&] { (void)shardings(g, s, 0); }, {"softmax", "at least 1"});
  EXPECT_TRUE(shardings(g, s, 4).empty());
  EXPECT_TRUE(shardings(g, r, 4).empty());
  EXPECT_TRUE(shardings(g, x, 4).empty());
  // Rows and columns of length 1 give nothing; K still splits. n = 1 gives nothing.
  auto options = shardings(g, one, 4);
  ASSERT_EQ(options.size(), 1u);
  EXPECT_EQ(options[0].cut, Cut::Reduction);
  EXPECT_TRUE(shardings(g, one, 1).empty());

  Graph sym;
  auto a = sym.input("a", ir::Shape(std::vector<ir::Dim>{ir::Dim::symbol("B"), 4}));
  auto e = sym.relu(a);
  testing::expect_error([&] { (void)shardings(sym, e, 2); }, {"relu", "symbolic", "bind"});
}

// ---- choose ------------------------------------------------------------------------------------------------

std::vector<WorkerCost> workers(int n, double rate) {
  std::vector<WorkerCost> w;
  for (int i = 0; i < n; ++i) w.push_back({"w" + std::to_string(i), rate});
  return w;
}

TEST(ShardChoose, SplittingABigMatmulWins) {
  Graph g;
  auto y = g.matmul(g.input("a", {1024, 1024}), g.input("b", {1024, 1024}));
  auto options = shardings(g, y, 4);
  auto ws = workers(4, 1e12);
  auto pick = choose(options, ws, LinkCost{1e-5, 1e10}, Residency{false}, 1e11);
  ASSERT_TRUE(pick.has_value());
  EXPECT_LT(pick->split_s, pick->whole_s);
  EXPECT_NEAR(pick->whole_s, 2.0 * 1024 * 1024 * 1024 / 1e11, 1e-9);
  EXPECT_EQ(pick->workers.size(), 4u);
  EXPECT_EQ(pick->runs.size(), 4u);
  // The prediction is the slowest worker's compute plus its transfer.
  const auto& o = pick->option;
  const double piece = o.flops[0] / 1e12 + 1e-5 + double(o.sliced_bytes[0] + o.result_bytes[0] + o.shared_bytes) / 1e10;
  EXPECT_NEAR(pick->split_s, piece, 1e-12);
  EXPECT_NE(pick->why.find("split"), std::string::npos) << pick->why;
}

TEST(ShardChoose, ATinyOpOverASlowLinkRunsWhole) {
  Graph g;
  auto y = g.add(g.input("a", {8}), g.input("b", {8}));
  auto options = shardings(g, y, 2);
  ASSERT_EQ(options.size(), 1u);
  ChoiceReport report;
  auto pick = choose(options, workers(2, 1e12), LinkCost{1e-3, 1e6}, Residency{true}, 1e9, &report);
  EXPECT_FALSE(pick.has_value());
  ASSERT_EQ(report.option_s.size(), 1u);
  EXPECT_GT(report.option_s[0], report.whole_s);
  EXPECT_NE(report.why.find("run whole"), std::string::npos) << report.why;
  // Nothing to choose from, or no worker: whole.
  EXPECT_FALSE(choose({}, workers(2, 1e12), LinkCost{0, 1e9}, Residency{}, 1e9).has_value());
  EXPECT_FALSE(choose(options, {}, LinkCost{0, 1e9}, Residency{}, 1e9).has_value());
}

// The seed's flip: a conv with large weights and a small batch. When the weights already sit on every worker
// the batch split wins; when they must be shipped it loses (to the out-channel split, and on its own to
// running whole).
TEST(ShardChoose, ResidencyFlipsTheBatchSplit) {
  Graph g;
  auto y = g.conv2d(g.input("x", {4, 256, 8, 8}), g.param("w", {256, 256, 3, 3}), g.param("b", {256}));
  auto options = shardings(g, y, 4);
  ASSERT_EQ(options.size(), 2u);
  auto ws = workers(4, 1e11);
  const LinkCost link{1e-5, 2e8};
  const double local = 2e10;

  auto resident = choose(options, ws, link, Residency{true}, local);
  ASSERT_TRUE(resident.has_value());
  EXPECT_EQ(resident->option.cut, Cut::Batch) << resident->why;
  auto shipped = choose(options, ws, link, Residency{false}, local);
  EXPECT_TRUE(!shipped || shipped->option.cut != Cut::Batch) << shipped->why;

  std::vector<ShardOption> batch_only;
  for (const auto& o : options)
    if (o.cut == Cut::Batch) batch_only.push_back(o);
  EXPECT_TRUE(choose(batch_only, ws, link, Residency{true}, local).has_value());
  ChoiceReport report;
  EXPECT_FALSE(choose(batch_only, ws, link, Residency{false}, local, &report).has_value()) << report.why;
}

TEST(ShardChoose, AWorkerThatIsNotRankableIsExcludedAndReported) {
  Graph g;
  auto y = g.matmul(g.input("a", {512, 512}), g.input("b", {512, 512}));
  auto options = shardings(g, y, 2);
  std::vector<WorkerCost> ws = {{"gpu0", 1e12}, {"npu", 1e15, /*rankable=*/false}, {"broken", 0}, {"gpu1", 1e12}};
  auto pick = choose(options, ws, LinkCost{1e-6, 1e11}, Residency{true}, 1e10);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->workers, (std::vector<std::string>{"gpu0", "gpu1"}));
  ASSERT_EQ(pick->excluded.size(), 2u);
  EXPECT_EQ(pick->excluded[0].worker, "npu");
  EXPECT_NE(pick->excluded[0].reason.find("not rankable"), std::string::npos);
  EXPECT_EQ(pick->excluded[1].worker, "broken");
  for (const auto& r : pick->runs) EXPECT_TRUE(r.worker == 0 || r.worker == 3);
  // Reported when the answer is "run whole" too.
  ChoiceReport report;
  EXPECT_FALSE(choose(options, std::span(ws).subspan(1, 1), LinkCost{1e-6, 1e11}, Residency{}, 1e10, &report));
  ASSERT_EQ(report.excluded.size(), 1u);
  EXPECT_EQ(report.excluded[0].worker, "npu");
}

TEST(ShardChoose, MorePiecesThanWorkersAndLocalWorkers) {
  Graph g;
  auto y = g.matmul(g.input("a", {256, 256}), g.input("b", {256, 256}));
  auto options = shardings(g, y, 4);
  // Two equal local workers share four pieces, two each, paying no transfer.
  std::vector<WorkerCost> ws = {{"cpu0", 1e11, true, true}, {"cpu1", 1e11, true, true}};
  auto pick = choose(options, ws, LinkCost{1, 1}, Residency{}, 1e11);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->runs.size(), 4u);
  int on0 = 0;
  for (const auto& r : pick->runs) {
    on0 += r.worker == 0 ? 1 : 0;
    EXPECT_EQ(r.transfer_s, 0);
  }
  EXPECT_EQ(on0, 2);
  EXPECT_NEAR(pick->split_s, pick->whole_s / 2, 1e-12);
}

TEST(ShardChoose, BadCosts) {
  Graph g;
  auto y = g.relu(g.input("a", {8, 8}));
  auto options = shardings(g, y, 2);
  testing::expect_error(
      [&] {
        (void)choose(options, workers(2, 1e9), LinkCost{0, 1e9}, Residency{}, 0);
      },
      {"local_rate"});
  testing::expect_error(
      [&] {
        (void)choose(options, workers(2, 1e9), LinkCost{0, 0}, Residency{}, 1e9);
      },
      {"bandwidth"});
  testing::expect_error(
      [&] {
        (void)choose(options, workers(2, 1e9), LinkCost{-1, 1e9}, Residency{}, 1e9);
      },
      {"latency"});
}

}  // namespace
}  // namespace rlx
