// The Llama forward pass over the flow blocks, and the host side of a
// generation step: rotary tables, the cache's write matrix and the mask.
#include "rlx/llm/model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "rlx/error.hpp"
#include "rlx/gguf/quants.hpp"

namespace rlx::llm {

namespace {

using flow::FlowCtx;
using flow::FlowValue;
using ir::DType;
using ir::NodeId;
using ir::Shape;
using i64 = std::int64_t;

std::string layer_key(std::int64_t i, std::string_view what) { return fmt::format("blk.{}.{}", i, what); }
std::string k_cache(std::int64_t i) { return fmt::format("k_cache.{}", i); }
std::string v_cache(std::int64_t i) { return fmt::format("v_cache.{}", i); }

// Rotates adjacent pairs (x[2i], x[2i+1]) by the position's angle for pair i:
// llama.cpp's "normal" rope, which GGUF's Llama Q and K weights are permuted for.
NodeId rope(ir::Graph& g, NodeId x, NodeId cos, NodeId sin, i64 tokens, i64 heads, i64 dim) {
  const i64 half = dim / 2;
  NodeId pairs = g.reshape(x, Shape{tokens, heads, half, 2});
  NodeId x0 = g.reshape(g.narrow(pairs, 3, 0, 1), Shape{tokens, heads, half});
  NodeId x1 = g.reshape(g.narrow(pairs, 3, 1, 1), Shape{tokens, heads, half});
  NodeId c = g.reshape(cos, Shape{tokens, 1, half}), s = g.reshape(sin, Shape{tokens, 1, half});
  NodeId o0 = g.sub(g.mul(x0, c), g.mul(x1, s));
  NodeId o1 = g.add(g.mul(x0, s), g.mul(x1, c));
  NodeId joined = g.concat({g.unsqueeze(o0, {3}), g.unsqueeze(o1, {3})}, 3);
  return g.reshape(joined, Shape{tokens, heads, dim});
}

// [kv_heads, context, dim] -> [1, heads, context, dim]: each KV head serves heads / kv_heads query heads.
NodeId repeat_kv(ir::Graph& g, NodeId kv, i64 kv_heads, i64 heads, i64 context, i64 dim) {
  if (kv_heads == heads) return g.reshape(kv, Shape{1, heads, context, dim});
  NodeId e = g.expand(g.reshape(kv, Shape{kv_heads, 1, context, dim}), Shape{kv_heads, heads / kv_heads, context, dim});
  return g.reshape(e, Shape{1, heads, context, dim});
}

struct Embed : flow::LayerStage {
  LlamaConfig c;
  explicit Embed(LlamaConfig config) : c(std::move(config)) {}
  std::string_view name() const override { return "token_embd"; }
  std::pair<FlowValue, flow::StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue tokens) const override {
    FlowValue table = ctx.param("token_embd.weight", Shape{c.vocab, c.n_embd});
    FlowValue x = ctx.value(ctx.hir().embedding(table.id(), tokens.id()));
    return {x, flow::StageArtifacts::hidden_only(x.shape())};
  }
};

// Pre-norm attention with rotary positions and grouped KV heads, then a SwiGLU MLP.
struct Block : flow::LayerStage {
  LlamaConfig c;
  i64 layer, tokens, context;
  std::string label;
  Block(LlamaConfig config, i64 i, i64 t, i64 ctx)
      : c(std::move(config)), layer(i), tokens(t), context(ctx), label(fmt::format("blk.{}", i)) {}
  std::string_view name() const override { return label; }

  std::pair<FlowValue, flow::StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue x) const override {
    ir::Graph& g = ctx.hir();
    const i64 H = c.n_head, Hkv = c.n_head_kv, D = c.head_dim, T = tokens, C = context;
    FlowValue h = ctx.rms_norm(x, layer_key(layer, "attn_norm"), c.rms_eps);
    NodeId q = g.reshape(ctx.linear(h, layer_key(layer, "attn_q"), H * D).id(), Shape{T, H, D});
    NodeId k = g.reshape(ctx.linear(h, layer_key(layer, "attn_k"), Hkv * D).id(), Shape{T, Hkv, D});
    NodeId v = g.reshape(ctx.linear(h, layer_key(layer, "attn_v"), Hkv * D).id(), Shape{T, Hkv, D});
    NodeId cos = ctx.input("rope_cos").id(), sin = ctx.input("rope_sin").id();
    q = rope(g, q, cos, sin, T, H, D);
    k = rope(g, k, cos, sin, T, Hkv, D);
    // The cache keeps the rows no token of this run writes, and takes the new
    // rows through the one-hot write matrix: [C, T] x [Hkv, T, D] -> [Hkv, C, D].
    NodeId write = ctx.input("kv_write").id(), keep = ctx.input("kv_keep").id();
    auto update = [&](const std::string& name, NodeId fresh) {
      NodeId cache = ctx.input(name).id();
      NodeId rows = g.matmul(write, g.permute(fresh, {1, 0, 2}));
      NodeId next = g.add(g.mul(cache, keep), rows);
      ctx.publish_side_output(name + ".out", ctx.value(next));
      return next;
    };
    NodeId kc = update(k_cache(layer), k), vc = update(v_cache(layer), v);
    NodeId q4 = g.reshape(g.permute(q, {1, 0, 2}), Shape{1, H, T, D});
    NodeId att = g.attention(q4, repeat_kv(g, kc, Hkv, H, C, D), repeat_kv(g, vc, Hkv, H, C, D), ctx.input("mask").id(),
                             false, 1 / std::sqrt(double(D)));
    NodeId merged = g.reshape(g.permute(g.reshape(att, Shape{H, T, D}), {1, 0, 2}), Shape{T, H * D});
    FlowValue o = ctx.linear(ctx.value(merged), layer_key(layer, "attn_output"), c.n_embd);
    x = ctx.residual(x, o);
    FlowValue f = ctx.rms_norm(x, layer_key(layer, "ffn_norm"), c.rms_eps);
    FlowValue gate = ctx.silu(ctx.linear(f, layer_key(layer, "ffn_gate"), c.n_ff));
    FlowValue up = ctx.linear(f, layer_key(layer, "ffn_up"), c.n_ff);
    x = ctx.residual(x, ctx.linear(ctx.mul(gate, up), layer_key(layer, "ffn_down"), c.n_embd));
    return {x, flow::StageArtifacts::hidden_only(x.shape())};
  }
};

struct Head : flow::LayerStage {
  LlamaConfig c;
  i64 tokens;
  bool all_positions;
  Head(LlamaConfig config, i64 t, bool all) : c(std::move(config)), tokens(t), all_positions(all) {}
  std::string_view name() const override { return "output"; }
  std::pair<FlowValue, flow::StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue x) const override {
    FlowValue h = ctx.rms_norm(x, "output_norm", c.rms_eps);
    if (!all_positions) {
      // The row of the last real token, picked by the host's one-hot "last" [1, T].
      h = ctx.matmul(ctx.input("last"), h);
    }
    FlowValue logits = ctx.linear(h, "output", c.vocab);
    return {logits, flow::StageArtifacts::hidden_only(logits.shape())};
  }
};

flow::BuiltModel build(const LlamaConfig& c, i64 tokens, i64 context, bool all_positions) {
  auto m = flow::ModelFlow::create(c.arch);
  m.input("tokens", Shape{tokens}, DType::I32)
      .input("rope_cos", Shape{tokens, c.head_dim / 2})
      .input("rope_sin", Shape{tokens, c.head_dim / 2})
      .input("kv_write", Shape{context, tokens})
      .input("kv_keep", Shape{context, 1})
      .input("mask", Shape{1, 1, tokens, context}, DType::Bool);
  if (!all_positions) m.input("last", Shape{1, tokens});
  for (i64 i = 0; i < c.n_layer; ++i) {
    m.input(k_cache(i), Shape{c.n_head_kv, context, c.head_dim});
    m.input(v_cache(i), Shape{c.n_head_kv, context, c.head_dim});
  }
  m.layer_stage(Embed(c));
  for (i64 i = 0; i < c.n_layer; ++i) m.layer_stage(Block(c, i, tokens, context));
  m.layer_stage(Head(c, tokens, all_positions));
  m.output("logits");
  return m.build();
}

// A GGUF tensor as float32 in row-major order (numpy's view: the reverse of ggml's dims).
ir::Tensor dequantized(const gguf::File& f, const std::string& name) {
  const gguf::TensorView t = f.tensor(name);
  std::vector<std::int64_t> shape(t.info->dims.rbegin(), t.info->dims.rend());
  ir::Tensor out(DType::F32, shape);
  gguf::dequantize(t.info->type, t.bytes, {out.data_as<float>(), std::size_t(out.numel())});
  return out;
}

// [rows, cols] -> [cols, rows]: GGUF stores a linear layer's weight as [out, in], linear() takes [in, out].
ir::Tensor transposed(const ir::Tensor& w) {
  const i64 rows = w.shape()[0], cols = w.shape()[1];
  ir::Tensor out(DType::F32, {cols, rows});
  const float* src = w.data_as<float>();
  float* dst = out.data_as<float>();
  constexpr i64 kTile = 32;  // tiles keep both sides in cache
  for (i64 r0 = 0; r0 < rows; r0 += kTile)
    for (i64 c0 = 0; c0 < cols; c0 += kTile)
      for (i64 r = r0; r < std::min(rows, r0 + kTile); ++r)
        for (i64 c = c0; c < std::min(cols, c0 + kTile); ++c) dst[c * rows + r] = src[r * cols + c];
  return out;
}

void check_shape(const ir::Tensor& t, std::vector<i64> want, const std::string& name) {
  if (t.shape() != want)
    throw Error(fmt::format("gguf: tensor '{}' is [{}], the model's metadata needs [{}]", name,
                            fmt::join(t.shape(), ", "), fmt::join(want, ", ")));
}

}  // namespace

LlamaConfig LlamaConfig::from_gguf(const gguf::File& file) {
  const gguf::Metadata& m = file.metadata();
  LlamaConfig c;
  c.arch = m.get_string("general.architecture");
  if (c.arch != "llama")
    throw Error("gguf '" + file.source() + "': general.architecture is '" + c.arch +
                "'; this loader reads the Llama layout (\"llama\")");
  auto key = [&](std::string_view k) { return c.arch + "." + std::string(k); };
  c.n_layer = m.get_integer(key("block_count"));
  c.n_embd = m.get_integer(key("embedding_length"));
  c.n_ff = m.get_integer(key("feed_forward_length"));
  c.n_head = m.get_integer(key("attention.head_count"));
  c.n_head_kv = m.find_integer(key("attention.head_count_kv")).value_or(c.n_head);
  c.context = m.get_integer(key("context_length"));
  if (c.n_layer <= 0 || c.n_embd <= 0 || c.n_ff <= 0 || c.n_head <= 0 || c.n_head_kv <= 0 || c.context <= 0)
    throw Error("gguf '" + file.source() + "': the Llama hyperparameters must be positive");
  if (c.n_embd % c.n_head != 0 || c.n_head % c.n_head_kv != 0)
    throw Error(fmt::format("gguf '{}': {} heads do not divide the width {}, or {} KV heads do not divide them",
                            file.source(), c.n_head, c.n_embd, c.n_head_kv));
  c.head_dim = c.n_embd / c.n_head;
  c.rope_dim = m.find_integer(key("rope.dimension_count")).value_or(c.head_dim);
  if (c.rope_dim != c.head_dim || c.head_dim % 2 != 0)
    throw Error(fmt::format("gguf '{}': rope.dimension_count {} with head dim {}: partial rotary is not supported",
                            file.source(), c.rope_dim, c.head_dim));
  if (m.contains(key("rope.freq_base"))) c.rope_base = m.get_float(key("rope.freq_base"));
  if (m.contains(key("attention.layer_norm_rms_epsilon")))
    c.rms_eps = m.get_float(key("attention.layer_norm_rms_epsilon"));
  const gguf::TensorInfo* embd = file.find_tensor("token_embd.weight");
  if (!embd || embd->dims.size() != 2) throw Error("gguf '" + file.source() + "': no 2-d tensor 'token_embd.weight'");
  c.vocab = embd->dims[1];
  c.tied_output = file.find_tensor("output.weight") == nullptr;
  return c;
}

struct LlamaModel::Impl {
  Impl(CompiledGraph p, CompiledGraph d, i64 c) : prefill(std::move(p)), decode(std::move(d)), chunk(c) {}
  CompiledGraph prefill, decode;
  CompiledGraph* cache_owner = &decode;  // the graph whose handles hold the cache
  i64 chunk = 0;
};

LlamaModel::LlamaModel(LlamaModel&&) noexcept = default;
LlamaModel& LlamaModel::operator=(LlamaModel&&) noexcept = default;
LlamaModel::~LlamaModel() = default;

flow::BuiltModel LlamaModel::build_graph(const LlamaConfig& config, std::int64_t tokens, std::int64_t context) {
  return build(config, tokens, context, true);
}

LlamaModel LlamaModel::load(const std::filesystem::path& path, const LoadOptions& options) {
  return load(gguf::File::open(path), options);
}

LlamaModel LlamaModel::load(const gguf::File& file, const LoadOptions& options) {
  LlamaModel m;
  m.config_ = LlamaConfig::from_gguf(file);
  const LlamaConfig& c = m.config_;
  m.context_ = options.context > 0 ? options.context : std::min<i64>(c.context, 512);
  if (m.context_ > c.context)
    throw Error(fmt::format("llm: a context of {} exceeds the model's {}", m.context_, c.context));
  if (options.prefill_chunk < 1) throw Error("llm: prefill_chunk must be >= 1");
  const i64 chunk = std::min(options.prefill_chunk, m.context_);
  Session session(options.device);
  auto impl = std::make_unique<Impl>(session.compile(build(c, chunk, m.context_, true).graph),
                                     session.compile(build(c, 1, m.context_, false).graph), chunk);

  // Weights: dequantized to float32 (linear layers transposed to [in, out]) into both graphs.
  auto set = [&](const std::string& param, const ir::Tensor& t) {
    impl->prefill.set_param(param, t);
    impl->decode.set_param(param, t);
  };
  const ir::Tensor embd = dequantized(file, "token_embd.weight");
  check_shape(embd, {c.vocab, c.n_embd}, "token_embd.weight");
  set("token_embd.weight", embd);
  set("output.weight", c.tied_output ? transposed(embd) : transposed(dequantized(file, "output.weight")));
  set("output_norm.weight", dequantized(file, "output_norm.weight"));
  const i64 q = c.n_head * c.head_dim, kv = c.n_head_kv * c.head_dim;
  const std::map<std::string, std::vector<i64>> linear{{"attn_q", {q, c.n_embd}},        {"attn_k", {kv, c.n_embd}},
                                                       {"attn_v", {kv, c.n_embd}},       {"attn_output", {c.n_embd, q}},
                                                       {"ffn_gate", {c.n_ff, c.n_embd}}, {"ffn_up", {c.n_ff, c.n_embd}},
                                                       {"ffn_down", {c.n_embd, c.n_ff}}};
  for (i64 i = 0; i < c.n_layer; ++i) {
    for (const auto& [what, shape] : linear) {
      const std::string name = layer_key(i, what + ".weight");
      const ir::Tensor w = dequantized(file, name);
      check_shape(w, shape, name);
      set(name, transposed(w));
    }
    for (const char* norm : {"attn_norm.weight", "ffn_norm.weight"}) {
      const ir::Tensor w = dequantized(file, layer_key(i, norm));
      check_shape(w, {c.n_embd}, layer_key(i, norm));
      set(layer_key(i, norm), w);
    }
  }
  // The cache: a handle per layer and kind, written back by every run.
  const ir::Tensor zeros(DType::F32, {c.n_head_kv, m.context_, c.head_dim});
  for (CompiledGraph* g : {&impl->prefill, &impl->decode})
    for (i64 i = 0; i < c.n_layer; ++i)
      for (const std::string& name : {k_cache(i), v_cache(i)}) {
        g->bind_handle(name, ir::view(zeros));
        g->feed_handle(name, name + ".out");
      }
  m.impl_ = std::move(impl);
  return m;
}

void LlamaModel::reset() { position_ = 0; }

std::vector<float> LlamaModel::forward(std::span<const std::int32_t> tokens, bool all_positions) {
  const LlamaConfig& c = config_;
  if (tokens.empty()) throw Error("llm: forward needs at least one token");
  if (position_ + i64(tokens.size()) > context_)
    throw Error(
        fmt::format("llm: {} tokens at position {} exceed the context of {}", tokens.size(), position_, context_));
  for (std::int32_t t : tokens)
    if (t < 0 || t >= c.vocab) throw Error(fmt::format("llm: token id {} is outside the vocabulary of {}", t, c.vocab));
  std::vector<float> out;
  std::size_t done = 0;
  while (done < tokens.size()) {
    const bool single = tokens.size() - done == 1 && !all_positions;
    CompiledGraph& g = single ? impl_->decode : impl_->prefill;
    const i64 T = single ? 1 : impl_->chunk;
    const i64 n = std::min<i64>(T, i64(tokens.size() - done)), C = context_, half = c.head_dim / 2;
    // The cache moves to the graph that runs next.
    if (impl_->cache_owner != &g) {
      for (i64 i = 0; i < c.n_layer; ++i)
        for (const std::string& name : {k_cache(i), v_cache(i)})
          g.bind_handle(name, ir::view(impl_->cache_owner->read_handle(name)));
      impl_->cache_owner = &g;
    }
    ir::Tensor ids(DType::I32, {T}), cos(DType::F32, {T, half}), sin(DType::F32, {T, half});
    ir::Tensor write(DType::F32, {C, T}), keep(DType::F32, {C, 1}), mask(DType::Bool, {1, 1, T, C});
    std::fill_n(keep.data_as<float>(), C, 1.0f);
    auto* m = reinterpret_cast<bool*>(mask.data());
    for (i64 t = 0; t < T; ++t) {
      const bool real = t < n;
      const i64 pos = real ? position_ + t : 0;
      ids.data_as<std::int32_t>()[t] = real ? tokens[done + std::size_t(t)] : 0;
      for (i64 i = 0; i < half; ++i) {
        const double theta = double(pos) * std::pow(c.rope_base, -2.0 * double(i) / double(c.head_dim));
        cos.data_as<float>()[t * half + i] = float(std::cos(theta));
        sin.data_as<float>()[t * half + i] = float(std::sin(theta));
      }
      if (real) {
        write.data_as<float>()[pos * T + t] = 1;
        keep.data_as<float>()[pos] = 0;
      }
      for (i64 j = 0; j < C; ++j) m[t * C + j] = j <= pos;  // a padding row attends to position 0 only
    }
    std::vector<runtime::NamedTensor> in{{"tokens", ir::view(ids)},   {"rope_cos", ir::view(cos)},
                                         {"rope_sin", ir::view(sin)}, {"kv_write", ir::view(write)},
                                         {"kv_keep", ir::view(keep)}, {"mask", ir::view(mask)}};
    ir::Tensor last(DType::F32, {1, T});
    if (single) {
      last.data_as<float>()[0] = 1;
      in.push_back({"last", ir::view(last)});
    }
    const std::vector<std::size_t> logits_only{0};
    const ir::Tensor logits = g.run_read_outputs(in, logits_only)[0];
    const float* p = logits.data_as<float>();
    if (single) {
      out.assign(p, p + c.vocab);
    } else if (all_positions) {
      out.insert(out.end(), p, p + n * c.vocab);
    } else if (done + std::size_t(n) == tokens.size()) {
      out.assign(p + (n - 1) * c.vocab, p + n * c.vocab);
    }
    done += std::size_t(n);
    position_ += n;
  }
  return out;
}

}  // namespace rlx::llm
