#include "rlx/models/demo_models.hpp"

#include <cmath>

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

ir::Graph encoder_block(const EncoderConfig& c) {
  ir::Graph g("encoder_block");
  const std::int64_t B = c.batch, S = c.seq, D = c.d_model, H = c.heads, Dh = D / H;
  auto x = g.input("x", {B, S, D});
  auto ln = [&](ir::NodeId v, const std::string& name) {
    return g.layer_norm(v, g.param(name + "_g", {D}), g.param(name + "_b", {D}), c.eps);
  };
  auto proj = [&](ir::NodeId v, const std::string& name, std::int64_t in, std::int64_t out) {
    return g.linear(v, g.param(name, {in, out}), g.param(name + "_bias", {out}));
  };
  auto heads = [&](ir::NodeId v) {
    return g.permute(g.reshape(v, std::vector<std::int64_t>{B, S, H, Dh}), {0, 2, 1, 3});
  };
  auto h = ln(x, "ln1");
  auto q = heads(proj(h, "wq", D, D));
  auto k = heads(proj(h, "wk", D, D));
  auto v = heads(proj(h, "wv", D, D));
  auto a = g.attention(q, k, v);
  a = g.reshape(g.permute(a, {0, 2, 1, 3}), std::vector<std::int64_t>{B, S, D});
  auto x1 = g.add(x, proj(a, "wo", D, D));
  auto f = ln(x1, "ln2");
  f = proj(g.unary(ir::OpKind::Gelu, proj(f, "w1", D, c.d_ff)), "w2", c.d_ff, D);
  g.add_output(g.add(x1, f), "y");
  return g;
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
