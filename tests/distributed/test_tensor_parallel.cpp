// A tensor-parallel MLP, y = relu(x W1 + b1) W2 + b2, cut Megatron-style into
// 2 shards: shard s holds the columns of W1 and b1 and the rows of W2 of its
// half of the hidden units, computes relu(x W1_s + b1_s) W2_s with no
// communication, and one all-reduce sums the shards' partial outputs before
// b2 is added. The ranges come from compile::shard (the first matmul cut by
// columns, the second by K). Each rank runs the shards it owns (rank r: shards s with
// s % world == r), so under mpirun -np 2 (distributed_mpirun_tensor_parallel)
// each rank runs one shard and the all-reduce crosses processes; under plain
// ctest one process runs both. The result must match the unsharded MLP within
// 1e-6.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>

#include "rlx/compile/shard.hpp"
#include "rlx/distributed/distributed.hpp"
#include "rlx/error.hpp"
#include "rlx/models/demo_models.hpp"
#include "rlx/runtime/session.hpp"

namespace {

using namespace rlx;

constexpr std::int64_t kBatch = 8, kIn = 32, kHidden = 64, kOut = 16;
constexpr int kShards = 2;

ir::Tensor random(std::vector<std::int64_t> shape, std::uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0F, 1.0F);
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& e : v) e = u(rng) * scale;
  return ir::Tensor::from_f32(std::move(shape), v);
}

// Columns [c0, c0 + cols) of a row-major [rows, all] matrix; a contiguous range of a vector when rows == 1.
ir::Tensor columns(const ir::Tensor& m, std::int64_t c0, std::int64_t cols) {
  const std::int64_t rows = m.shape().size() == 1 ? 1 : m.shape()[0], all = m.shape().back();
  std::vector<float> v;
  for (std::int64_t r = 0; r < rows; ++r)
    v.insert(v.end(), m.data_as<float>() + r * all + c0, m.data_as<float>() + r * all + c0 + cols);
  return m.shape().size() == 1 ? ir::Tensor::from_f32({cols}, v) : ir::Tensor::from_f32({rows, cols}, v);
}
ir::Tensor rows(const ir::Tensor& m, std::int64_t r0, std::int64_t n) {
  const std::int64_t cols = m.shape()[1];
  std::vector<float> v(m.data_as<float>() + r0 * cols, m.data_as<float>() + (r0 + n) * cols);
  return ir::Tensor::from_f32({n, cols}, v);
}

TEST(TensorParallel, ColumnThenRowSplitMlpMatchesTheWholeWithOneAllReduce) {
  auto comm = distributed::init();
  const ir::Tensor x = random({kBatch, kIn}, 1, 1.0F), w1 = random({kIn, kHidden}, 2, 0.2F),
                   b1 = random({kHidden}, 3, 0.1F), w2 = random({kHidden, kOut}, 4, 0.2F), b2 = random({kOut}, 5, 0.1F);
  runtime::Session session;

  // The whole MLP, in every process, with its matmuls as nodes of their own so that compile::shard can cut them.
  ir::Graph whole("mlp");
  ir::NodeId mm1 = 0, mm2 = 0;
  {
    auto xi = whole.input("x", {kBatch, kIn});
    mm1 = whole.matmul(xi, whole.param("w1", {kIn, kHidden}));
    auto h = whole.relu(whole.add(mm1, whole.param("b1", {kHidden})));
    mm2 = whole.matmul(h, whole.param("w2", {kHidden, kOut}));
    whole.add_output(whole.add(mm2, whole.param("b2", {kOut})), "y");
  }
  auto full = session.compile(whole);
  for (const auto& [n, t] : {std::pair{"w1", &w1}, {"b1", &b1}, {"w2", &w2}, {"b2", &b2}}) full.set_param(n, *t);
  const ir::Tensor want = full.run({{"x", x}})[0];

  // The cuts, from compile::shard: the first matmul by columns (W1 sliced on its column axis, x shared), the
  // second by K (h and W2 sliced on the hidden axis, the partial products summed). Megatron's condition is
  // that they line up: shard s's columns of W1 are its rows of W2, so relu runs on its slice alone.
  const auto pick = [&](ir::NodeId node, compile::shard::Cut cut) {
    for (auto& o : compile::shard::shardings(whole, node, kShards))
      if (o.cut == cut) return o;
    throw std::runtime_error("no " + std::string(compile::shard::cut_name(cut)) + " cut");
  };
  const auto columns_cut = pick(mm1, compile::shard::Cut::Columns);
  const auto k_cut = pick(mm2, compile::shard::Cut::Reduction);
  ASSERT_EQ(columns_cut.operands[1].axis, 1);  // W1's columns
  ASSERT_EQ(k_cut.operands[1].axis, 0);        // W2's rows
  ASSERT_EQ(k_cut.recombine, compile::shard::Recombine::Sum);
  ASSERT_EQ(columns_cut.ranges, k_cut.ranges);
  ASSERT_EQ(columns_cut.ranges.size(), static_cast<std::size_t>(kShards));

  // One shard's partial output: its hidden units only; no bias after W2 (b2 is added once, after the sum).
  const std::int64_t part = kHidden / kShards;
  ir::Graph shard("mlp_shard");
  {
    auto xi = shard.input("x", {kBatch, kIn});
    auto h = shard.relu(shard.linear(xi, shard.param("w1", {kIn, part}), shard.param("b1", {part})));
    shard.add_output(shard.matmul(h, shard.param("w2", {part, kOut})), "partial");
  }
  auto compiled = session.compile(shard);
  ir::Tensor partial(ir::DType::F32, {kBatch, kOut});
  int owned = 0;
  for (int s = comm.rank(); s < kShards; s += comm.world_size()) {
    const compile::shard::Range r = columns_cut.ranges[static_cast<std::size_t>(s)];
    ASSERT_EQ(r.length, part);
    compiled.set_param("w1", columns(w1, r.start, r.length));
    compiled.set_param("b1", columns(b1, r.start, r.length));
    compiled.set_param("w2", rows(w2, r.start, r.length));
    const ir::Tensor p = compiled.run({{"x", x}})[0];
    for (std::int64_t i = 0; i < p.numel(); ++i) partial.data_as<float>()[i] += p.data_as<float>()[i];
    ++owned;
  }
  EXPECT_EQ(owned, comm.world_size() <= kShards ? kShards / comm.world_size() : (comm.rank() < kShards ? 1 : 0));
  comm.all_reduce(partial);  // the one collective
  double worst = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double got = static_cast<double>(partial.data_as<float>()[i]) + b2.data_as<float>()[i % kOut];
    worst = std::max(worst, std::abs(got - static_cast<double>(want.data_as<float>()[i])));
  }
  EXPECT_LE(worst, 1e-6) << "rank " << comm.rank() << " of " << comm.world_size();
  // And a wrong split (shard 0's columns with shard 1's rows) would not pass: the check can fail.
  compiled.set_param("w1", columns(w1, 0, part));
  compiled.set_param("b1", columns(b1, 0, part));
  compiled.set_param("w2", rows(w2, part, part));
  const ir::Tensor wrong = compiled.run({{"x", x}})[0];
  double off = 0;
  for (std::int64_t i = 0; i < wrong.numel(); ++i)
    off += std::abs(wrong.data_as<float>()[i] - partial.data_as<float>()[i]);
  EXPECT_GT(off, 1e-3);
}

// Self-attention, y = concat_h(attention(x Wq_h, x Wk_h, x Wv_h)) Wo (+ bo when `bias`), over `heads` heads of
// width kHeadDim: x [kB, kS, heads_all * kHeadDim], Wq/Wk/Wv [E, heads * kHeadDim], Wo [heads * kHeadDim, E].
constexpr std::int64_t kB = 2, kS = 6, kHeads = 4, kHeadDim = 8, kE = kHeads * kHeadDim;
ir::Graph attention_block(std::int64_t heads, bool bias) {
  ir::Graph g(bias ? "attention" : "attention_shard");
  const std::int64_t w = heads * kHeadDim;
  auto x = g.reshape(g.input("x", {kB, kS, kE}), std::vector<std::int64_t>{kB * kS, kE});
  const auto split = [&](ir::NodeId t) {  // [B*S, heads*D] -> [B, heads, S, D]
    return g.permute(g.reshape(t, std::vector<std::int64_t>{kB, kS, heads, kHeadDim}), {0, 2, 1, 3});
  };
  auto q = split(g.matmul(x, g.param("wq", {kE, w})));
  auto k = split(g.matmul(x, g.param("wk", {kE, w})));
  auto v = split(g.matmul(x, g.param("wv", {kE, w})));
  auto a = g.reshape(g.permute(g.attention(q, k, v, std::nullopt, true), {0, 2, 1, 3}),
                     std::vector<std::int64_t>{kB * kS, w});
  auto y = bias ? g.linear(a, g.param("wo", {w, kE}), g.param("bo", {kE})) : g.matmul(a, g.param("wo", {w, kE}));
  g.add_output(g.reshape(y, std::vector<std::int64_t>{kB, kS, kE}), "y");
  return g;
}

TEST(TensorParallel, AttentionBlockSplitByHeadsMatchesTheWholeWithOneAllReduce) {
  auto comm = distributed::init();
  const ir::Tensor x = random({kB, kS, kE}, 11, 1.0F), wq = random({kE, kE}, 12, 0.2F), wk = random({kE, kE}, 13, 0.2F),
                   wv = random({kE, kE}, 14, 0.2F), wo = random({kE, kE}, 15, 0.2F), bo = random({kE}, 16, 0.1F);
  runtime::Session session;
  const ir::Graph whole = attention_block(kHeads, true);
  auto full = session.compile(whole);
  for (const auto& [n, t] : {std::pair{"wq", &wq}, {"wk", &wk}, {"wv", &wv}, {"wo", &wo}, {"bo", &bo}})
    full.set_param(n, *t);
  const ir::Tensor want = full.run({{"x", x}})[0];

  // Shard s: its heads, from compile::shard's cut of the attention node by heads; those columns of Wq, Wk, Wv
  // and those rows of Wo.
  std::optional<compile::shard::ShardOption> by_heads;
  for (ir::NodeId n = 0; n < static_cast<ir::NodeId>(whole.nodes().size()); ++n)
    if (whole.node(n).op == ir::OpKind::Attention)
      for (auto& o : compile::shard::shardings(whole, n, kShards))
        if (o.cut == compile::shard::Cut::Heads) by_heads = o;
  ASSERT_TRUE(by_heads.has_value());
  ASSERT_EQ(by_heads->extent, kHeads);
  ASSERT_EQ(by_heads->ranges.size(), static_cast<std::size_t>(kShards));
  const std::int64_t heads = kHeads / kShards, width = heads * kHeadDim;
  auto shard = session.compile(attention_block(heads, false));
  ir::Tensor partial(ir::DType::F32, {kB, kS, kE});
  for (int s = comm.rank(); s < kShards; s += comm.world_size()) {
    const compile::shard::Range r = by_heads->ranges[static_cast<std::size_t>(s)];
    ASSERT_EQ(r.length, heads);
    const std::int64_t c0 = r.start * kHeadDim;
    shard.set_param("wq", columns(wq, c0, width));
    shard.set_param("wk", columns(wk, c0, width));
    shard.set_param("wv", columns(wv, c0, width));
    shard.set_param("wo", rows(wo, c0, width));
    const ir::Tensor p = shard.run({{"x", x}})[0];
    for (std::int64_t i = 0; i < p.numel(); ++i) partial.data_as<float>()[i] += p.data_as<float>()[i];
  }
  comm.all_reduce(partial);  // the one collective
  double worst = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double got = static_cast<double>(partial.data_as<float>()[i]) + bo.data_as<float>()[i % kE];
    worst = std::max(worst, std::abs(got - static_cast<double>(want.data_as<float>()[i])));
  }
  EXPECT_LE(worst, 1e-6) << "rank " << comm.rank() << " of " << comm.world_size();
  EXPECT_GT(std::abs(want.data_as<float>()[0]), 1e-3);  // a real output, not zeros on both sides
}

// Where the ranks run their shards: their GPUs under the nccl engine (bench/gpu.sh nccl), the CPU otherwise.
runtime::Device rank_device(const distributed::Communicator& c) {
  return c.engine() == "nccl" ? runtime::Device::Cuda : runtime::Device::Cpu;
}

// models::encoder_block cut over 2 shards, Megatron-style (models::encoder_block_shard): attention by heads, the
// FFN by hidden units, one all-reduce after each. Every rank ends with the whole block's y.
TEST(TensorParallel, EncoderBlockMatchesTheWholeWithTwoAllReduces) {
  auto comm = distributed::init();
  const models::EncoderConfig c{.batch = 2, .seq = 16, .d_model = 64, .heads = 4, .d_ff = 128};
  const ir::Graph whole = models::encoder_block(c);
  const auto params = models::random_params(whole, 5);
  const auto inputs = models::random_inputs(whole, 6);
  runtime::Session session(rank_device(comm));
  auto full = session.compile(whole);
  for (const auto& [n, t] : params) full.set_param(n, t);
  const ir::Tensor want = full.run({{"x", inputs.at("x")}})[0];

  // The ranges: the attention node by heads, and W1's columns (the FFN's hidden units), from compile::shard.
  const auto heads = [&] {
    for (ir::NodeId n = 0; n < static_cast<ir::NodeId>(whole.nodes().size()); ++n)
      if (whole.node(n).op == ir::OpKind::Attention)
        for (auto& o : compile::shard::shardings(whole, n, kShards))
          if (o.cut == compile::shard::Cut::Heads) return o.ranges;
    throw std::runtime_error("no heads cut");
  }();
  const auto hidden = compile::shard::split_extent(c.d_ff, kShards);
  ASSERT_EQ(heads.size(), static_cast<std::size_t>(kShards));

  ir::Tensor x1(ir::DType::F32, {c.batch, c.seq, c.d_model}), y(ir::DType::F32, {c.batch, c.seq, c.d_model});
  const auto add_into = [](ir::Tensor& acc, const ir::Tensor& t) {
    for (std::int64_t i = 0; i < t.numel(); ++i) acc.data_as<float>()[i] += t.data_as<float>()[i];
  };
  // Each rank runs the shards it owns (all of them in one process under plain ctest); one all-reduce per part.
  std::vector<std::pair<runtime::CompiledGraph, runtime::CompiledGraph>> mine;
  for (int s = comm.rank(); s < kShards; s += comm.world_size()) {
    const auto i = static_cast<std::size_t>(s);
    const models::EncoderShardRange r{heads[i].start, heads[i].length, hidden[i].start, hidden[i].length, s == 0};
    const auto shard = models::encoder_block_shard(c, r);
    auto attention = session.compile(shard.attention);
    auto ffn = session.compile(shard.ffn);
    for (const auto& [n, t] : models::encoder_shard_params(params, c, r)) {
      for (auto* part : {&attention, &ffn})
        for (const auto& spec : part->param_specs())
          if (spec.name == n) part->set_param(n, t);
    }
    mine.emplace_back(std::move(attention), std::move(ffn));
  }
  for (auto& [attention, ffn] : mine) add_into(x1, attention.run({{"x", inputs.at("x")}})[0]);
  comm.all_reduce(x1);
  for (auto& [attention, ffn] : mine) add_into(y, ffn.run({{"x1", x1}})[0]);
  comm.all_reduce(y);

  double worst = 0, scale = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    worst = std::max(worst, std::abs(double(y.data_as<float>()[i]) - double(want.data_as<float>()[i])));
    scale = std::max(scale, std::abs(double(want.data_as<float>()[i])));
  }
  EXPECT_LE(worst, 1e-5) << "rank " << comm.rank() << " of " << comm.world_size() << " on "
                         << runtime::device_label(session.device());
  EXPECT_GT(scale, 0.1);  // a real output

  // Ranges outside the block's heads or hidden units, or empty ones, are refused.
  EXPECT_THROW(models::encoder_block_shard(c, {.head0 = 3, .heads = 2, .ff0 = 0, .ff = 8}), Error);
  EXPECT_THROW(models::encoder_block_shard(c, {.head0 = 0, .heads = 1, .ff0 = 0, .ff = 0}), Error);
}

}  // namespace
