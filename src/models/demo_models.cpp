#include "rlx/models/demo_models.hpp"

#include <cmath>

#include "rlx/error.hpp"
#include "rlx/ir/random.hpp"

namespace rlx::models {

ir::Graph mlp(const MlpConfig& c) {
  ir::Graph g("mlp");
  auto h = g.input("x", {c.batch, c.width});
  for (int i = 0; i < c.layers; ++i) {
    auto w = g.param("w" + std::to_string(i), {c.width, c.width});
    auto b = g.param("b" + std::to_string(i), {c.width});
    h = g.linear(h, w, b);
    if (i + 1 < c.layers) h = g.relu(h);
  }
  g.add_output(h, "y");
  return g;
}

namespace {

// The block's halves over `heads` of its heads and `ff` of its hidden units (all of them in the whole block).
// `closes`: the half adds the residual and its output projection's bias, as the whole block does; a shard that
// does not lead leaves both to shard 0 and returns its bare partial product.
ir::NodeId layer_norm(ir::Graph& g, const EncoderConfig& c, ir::NodeId v, const std::string& name) {
  return g.layer_norm(v, g.param(name + "_g", {c.d_model}), g.param(name + "_b", {c.d_model}), c.eps);
}

ir::NodeId out_projection(ir::Graph& g, ir::NodeId residual, ir::NodeId v, const std::string& name, std::int64_t in,
                          std::int64_t out, bool closes) {
  if (!closes) return g.matmul(v, g.param(name, {in, out}));
  return g.add(residual, g.linear(v, g.param(name, {in, out}), g.param(name + "_bias", {out})));
}

ir::NodeId attention_half(ir::Graph& g, const EncoderConfig& c, ir::NodeId x, std::int64_t heads, bool closes) {
  const std::int64_t B = c.batch, S = c.seq, D = c.d_model, Dh = D / c.heads, W = heads * Dh;
  auto h = layer_norm(g, c, x, "ln1");
  auto split = [&](const std::string& name) {
    auto t = g.linear(h, g.param(name, {D, W}), g.param(name + "_bias", {W}));
    return g.permute(g.reshape(t, std::vector<std::int64_t>{B, S, heads, Dh}), {0, 2, 1, 3});
  };
  auto q = split("wq");
  auto k = split("wk");
  auto v = split("wv");
  auto a = g.reshape(g.permute(g.attention(q, k, v), {0, 2, 1, 3}), std::vector<std::int64_t>{B, S, W});
  return out_projection(g, x, a, "wo", W, D, closes);
}

ir::NodeId ffn_half(ir::Graph& g, const EncoderConfig& c, ir::NodeId x1, std::int64_t ff, bool closes) {
  auto f = layer_norm(g, c, x1, "ln2");
  f = g.unary(ir::OpKind::Gelu, g.linear(f, g.param("w1", {c.d_model, ff}), g.param("w1_bias", {ff})));
  return out_projection(g, x1, f, "w2", ff, c.d_model, closes);
}

// Elements [first, first + count) of the last axis of every row of a row-major tensor ([n] or [rows, n]), or rows
// [first, first + count) of a matrix when `rows`.
ir::Tensor slice(const ir::Tensor& t, std::int64_t first, std::int64_t count, bool rows) {
  const auto& shape = t.shape();
  const std::size_t size = ir::dtype_size(t.dtype());
  if (rows) {
    const auto row_bytes = static_cast<std::size_t>(shape[1]) * size;
    std::vector<std::byte> bytes(t.data() + static_cast<std::size_t>(first) * row_bytes,
                                 t.data() + static_cast<std::size_t>(first + count) * row_bytes);
    return ir::Tensor(t.dtype(), {count, shape[1]}, bytes);
  }
  const std::int64_t n = shape.back(), outer = t.numel() / n;
  std::vector<std::byte> bytes;
  for (std::int64_t r = 0; r < outer; ++r) {
    const std::byte* row = t.data() + static_cast<std::size_t>(r * n + first) * size;
    bytes.insert(bytes.end(), row, row + static_cast<std::size_t>(count) * size);
  }
  std::vector<std::int64_t> out = shape;
  out.back() = count;
  return ir::Tensor(t.dtype(), out, bytes);
}

}  // namespace

ir::Graph encoder_block(const EncoderConfig& c) {
  ir::Graph g("encoder_block");
  auto x = g.input("x", {c.batch, c.seq, c.d_model});
  g.add_output(ffn_half(g, c, attention_half(g, c, x, c.heads, true), c.d_ff, true), "y");
  return g;
}

EncoderShard encoder_block_shard(const EncoderConfig& c, const EncoderShardRange& r) {
  if (r.heads < 1 || r.head0 < 0 || r.head0 + r.heads > c.heads || r.ff < 1 || r.ff0 < 0 || r.ff0 + r.ff > c.d_ff)
    throw Error("models.encoder_block_shard: heads [" + std::to_string(r.head0) + ", +" + std::to_string(r.heads) +
                ") and hidden units [" + std::to_string(r.ff0) + ", +" + std::to_string(r.ff) +
                ") are not non-empty ranges of the block's " + std::to_string(c.heads) + " heads and " +
                std::to_string(c.d_ff) + " hidden units");
  EncoderShard s{ir::Graph("encoder_block_attention_shard"), ir::Graph("encoder_block_ffn_shard")};
  s.attention.add_output(
      attention_half(s.attention, c, s.attention.input("x", {c.batch, c.seq, c.d_model}), r.heads, r.lead), "partial");
  s.ffn.add_output(ffn_half(s.ffn, c, s.ffn.input("x1", {c.batch, c.seq, c.d_model}), r.ff, r.lead), "partial");
  return s;
}

std::map<std::string, ir::Tensor, std::less<>> encoder_shard_params(
    const std::map<std::string, ir::Tensor, std::less<>>& whole, const EncoderConfig& c, const EncoderShardRange& r) {
  const auto at = [&](const std::string& name) -> const ir::Tensor& {
    auto it = whole.find(name);
    if (it == whole.end()) throw Error("models.encoder_shard_params: no param '" + name + "' among the block's");
    return it->second;
  };
  const std::int64_t Dh = c.d_model / c.heads, c0 = r.head0 * Dh, w = r.heads * Dh;
  std::map<std::string, ir::Tensor, std::less<>> out;
  for (const char* name : {"ln1_g", "ln1_b", "ln2_g", "ln2_b"}) out.emplace(name, at(name));
  for (const std::string name : {"wq", "wk", "wv"}) {  // column-parallel: this shard's heads
    out.emplace(name, slice(at(name), c0, w, false));
    out.emplace(name + "_bias", slice(at(name + "_bias"), c0, w, false));
  }
  out.emplace("wo", slice(at("wo"), c0, w, true));  // row-parallel
  out.emplace("w1", slice(at("w1"), r.ff0, r.ff, false));
  out.emplace("w1_bias", slice(at("w1_bias"), r.ff0, r.ff, false));
  out.emplace("w2", slice(at("w2"), r.ff0, r.ff, true));
  if (r.lead)
    for (const char* name : {"wo_bias", "w2_bias"}) out.emplace(name, at(name));
  return out;
}

namespace {
ir::Tensor random_like(const ir::Node& n, std::uint64_t seed, double scale, double offset) {
  ir::Tensor t(n.dtype, n.shape.extents());
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.set(i, offset + scale * (2.0 * ir::rng_uniform01(seed, static_cast<std::uint64_t>(i)) - 1.0));
  return t;
}
}  // namespace

std::map<std::string, ir::Tensor, std::less<>> random_params(const ir::Graph& g, std::uint64_t seed) {
  std::map<std::string, ir::Tensor, std::less<>> out;
  for (auto id : g.param_ids()) {
    const auto& n = g.node(id);
    const auto& name = n.attrs.get_str("name");
    bool gamma = name.size() > 2 && name.ends_with("_g");
    double fan_in = n.shape.rank() >= 2 ? static_cast<double>(n.shape[0].size) : 1.0;
    double scale = n.shape.rank() >= 2 ? std::sqrt(3.0 / fan_in) : 0.1;
    out.emplace(name, random_like(n, seed + id * 7919, scale, gamma ? 1.0 : 0.0));
  }
  return out;
}

std::map<std::string, ir::Tensor, std::less<>> random_inputs(const ir::Graph& g, std::uint64_t seed) {
  std::map<std::string, ir::Tensor, std::less<>> out;
  for (auto id : g.input_ids()) {
    const auto& n = g.node(id);
    out.emplace(n.attrs.get_str("name"), random_like(n, seed + id * 104729, 1.0, 0.0));
  }
  return out;
}

}  // namespace rlx::models
