// The Llama forward pass over the flow blocks, and the host side of a
// generation step: rotary tables, the cache's write matrix and the mask.
#include "rlx/llm/model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include "rlx/error.hpp"
#include "rlx/gguf/quants.hpp"
#include "rlx/ir/quants.hpp"

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

// Rotates adjacent pairs (x[2i], x[2i+1]) by the position's angle for pair i: llama.cpp's "normal" rope, which
// GGUF's Llama Q and K weights are permuted for. cos and sin are [tokens, dim / 2], shared by the heads.
NodeId rope(ir::Graph& g, NodeId x, NodeId cos, NodeId sin, i64 tokens, i64 heads, i64 dim) {
  const Shape per_token{tokens, 1, dim / 2};
  return g.rope(g.reshape(x, Shape{tokens, heads, dim}), g.reshape(cos, per_token), g.reshape(sin, per_token));
}

// y = x W^T for a weight stored as GGUF stores it, [out, in]: quantized_matmul on a block-quantized W
// (read in its blocks), matmul with W transposed on an f32 one.
FlowValue linear(FlowCtx& ctx, const LlamaConfig& c, const std::string& act, const FlowValue& x,
                 const std::string& name, i64 out) {
  const std::string w = name + ".weight";
  const ir::Shape& xs = x.shape();
  const DType t = c.weight_dtype(w);
  FlowValue wv = ctx.param(w, Shape{out, xs[xs.rank() - 1].size}, t);
  ir::Graph& g = ctx.hir();
  if (ir::is_block_quantized(t)) return ctx.value(g.quantized_matmul(x.id(), wv.id(), act));
  return ctx.value(g.matmul(x.id(), g.permute(wv.id(), {1, 0})));
}

struct Embed : flow::LayerStage {
  LlamaConfig c;
  explicit Embed(LlamaConfig config) : c(std::move(config)) {}
  std::string_view name() const override { return "token_embd"; }
  std::pair<FlowValue, flow::StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue tokens) const override {
    FlowValue table = ctx.param("token_embd.weight", Shape{c.vocab, c.n_embd}, c.weight_dtype("token_embd.weight"));
    FlowValue x = ctx.value(ctx.hir().embedding(table.id(), tokens.id()));
    return {x, flow::StageArtifacts::hidden_only(x.shape())};
  }
};

// Pre-norm attention with rotary positions and grouped KV heads, then a SwiGLU MLP.
struct Block : flow::LayerStage {
  const LlamaConfig& c;
  std::string act;
  i64 layer, tokens, context;
  std::string label;
  Block(const LlamaConfig& config, std::string_view activations, i64 i, i64 t, i64 ctx)
      : c(config), act(activations), layer(i), tokens(t), context(ctx), label(fmt::format("blk.{}", i)) {}
  std::string_view name() const override { return label; }

  std::pair<FlowValue, flow::StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue x) const override {
    ir::Graph& g = ctx.hir();
    const i64 H = c.n_head, Hkv = c.n_head_kv, D = c.head_dim, T = tokens, C = context;
    FlowValue h = ctx.rms_norm(x, layer_key(layer, "attn_norm"), c.rms_eps);
    auto lin = [&](const FlowValue& in, std::string_view what, i64 out) {
      return linear(ctx, c, act, in, layer_key(layer, what), out);
    };
    NodeId q = g.reshape(lin(h, "attn_q", H * D).id(), Shape{T, H, D});
    NodeId k = g.reshape(lin(h, "attn_k", Hkv * D).id(), Shape{T, Hkv, D});
    NodeId v = g.reshape(lin(h, "attn_v", Hkv * D).id(), Shape{T, Hkv, D});
    NodeId cos = ctx.input("rope_cos").id(), sin = ctx.input("rope_sin").id();
    q = rope(g, q, cos, sin, T, H, D);
    k = rope(g, k, cos, sin, T, Hkv, D);
    // The run's rows go into the cache at its position: [Hkv, T, D] into [Hkv, C, D] along axis 1. The
    // cache is an input fed back from this output, so the CPU writes the T rows in place.
    NodeId pos = ctx.input("kv_pos").id();
    auto update = [&](const std::string& name, NodeId fresh) {
      NodeId next = g.dynamic_update_slice(ctx.input(name).id(), g.permute(fresh, {1, 0, 2}), pos, 1);
      ctx.publish_side_output(name + ".out", ctx.value(next));
      return g.reshape(next, Shape{1, Hkv, C, D});
    };
    NodeId kc = update(k_cache(layer), k), vc = update(v_cache(layer), v);
    NodeId q4 = g.reshape(g.permute(q, {1, 0, 2}), Shape{1, H, T, D});
    // Grouped-query attention over the cache; the mask hides the rows not written yet, which the CPU skips.
    NodeId att = g.attention(q4, kc, vc, ctx.input("mask").id(), false, 1 / std::sqrt(double(D)));
    NodeId merged = g.reshape(g.permute(g.reshape(att, Shape{H, T, D}), {1, 0, 2}), Shape{T, H * D});
    FlowValue o = lin(ctx.value(merged), "attn_output", c.n_embd);
    x = ctx.residual(x, o);
    FlowValue f = ctx.rms_norm(x, layer_key(layer, "ffn_norm"), c.rms_eps);
    FlowValue gate = ctx.silu(lin(f, "ffn_gate", c.n_ff));
    FlowValue up = lin(f, "ffn_up", c.n_ff);
    x = ctx.residual(x, lin(ctx.mul(gate, up), "ffn_down", c.n_embd));
    return {x, flow::StageArtifacts::hidden_only(x.shape())};
  }
};

struct Head : flow::LayerStage {
  const LlamaConfig& c;
  std::string act;
  i64 tokens;
  bool all_positions;
  Head(const LlamaConfig& config, std::string_view activations, i64 t, bool all)
      : c(config), act(activations), tokens(t), all_positions(all) {}
  std::string_view name() const override { return "output"; }
  std::pair<FlowValue, flow::StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue x) const override {
    FlowValue h = ctx.rms_norm(x, "output_norm", c.rms_eps);
    if (!all_positions) {
      // The row of the last real token, picked by the host's one-hot "last" [1, T].
      h = ctx.matmul(ctx.input("last"), h);
    }
    // A tied output reads the token embedding's rows, in their blocks.
    FlowValue logits = linear(ctx, c, act, h, c.tied_output ? "token_embd" : "output", c.vocab);
    return {logits, flow::StageArtifacts::hidden_only(logits.shape())};
  }
};

flow::BuiltModel build(const LlamaConfig& c, i64 tokens, i64 context, bool all_positions, std::string_view act) {
  auto m = flow::ModelFlow::create(c.arch);
  m.input("tokens", Shape{tokens}, DType::I32)
      .input("rope_cos", Shape{tokens, c.head_dim / 2})
      .input("rope_sin", Shape{tokens, c.head_dim / 2})
      .input("kv_pos", Shape{1}, DType::I32)
      .input("mask", Shape{1, 1, tokens, context}, DType::Bool);
  if (!all_positions) m.input("last", Shape{1, tokens});
  for (i64 i = 0; i < c.n_layer; ++i) {
    m.input(k_cache(i), Shape{c.n_head_kv, context, c.head_dim});
    m.input(v_cache(i), Shape{c.n_head_kv, context, c.head_dim});
  }
  m.layer_stage(Embed(c));
  for (i64 i = 0; i < c.n_layer; ++i) m.layer_stage(Block(c, act, i, tokens, context));
  m.layer_stage(Head(c, act, tokens, all_positions));
  m.output("logits");
  return m.build();
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

DType LlamaConfig::weight_dtype(std::string_view name) const {
  auto it = weight_dtypes.find(name);
  return it == weight_dtypes.end() ? DType::F32 : it->second;
}

struct LlamaModel::Impl {
  using Weights = std::vector<std::pair<std::string, std::vector<i64>>>;
  Impl(std::shared_ptr<const gguf::File> f, Session s, std::string a, Weights w, CompiledGraph p, CompiledGraph d,
       i64 c, i64 r)
      : file(std::move(f)),
        session(std::move(s)),
        act(std::move(a)),
        weights(std::move(w)),
        prefill(std::move(p)),
        decode(std::move(d)),
        chunk(c),
        cache_rows(r) {}
  std::shared_ptr<const gguf::File> file;  // the mapping the params are read from
  Session session;
  std::string act;  // quantized_matmul's activations
  Weights weights;  // every weight the graphs read, with its shape
  // A prompt chunk's logits are needed at every position only for forward(..., true) (scoring, tests); generation
  // needs the last row's. So `prefill` computes the output layer for one row, which saves the vocabulary-wide
  // matmul for all the others (a fifth of SmolLM2's prefill work). It, `decode` and the short prompts' graph are
  // compiled at load; the one with every position's logits on first use. All but the first two are in `others`.
  CompiledGraph prefill, decode;
  std::map<std::pair<i64, bool>, CompiledGraph> others;  // by (tokens per run, every position's logits)
  CompiledGraph* cache_owner = &decode;                  // the graph whose handles hold the cache
  CompiledGraph* last_prefill = &prefill;                // the last graph that ran more than one token
  i64 chunk = 0;
  i64 cache_rows = 0;  // the context plus chunk - 1

  bool profiling = false;

  // A prompt's rest of r tokens runs in chunks of kShortChunk while that pads it to at most half a chunk: a
  // 5-token chat turn then computes 16 rows, not 64.
  static constexpr i64 kShortChunk = 16;
  i64 tokens_per_run(i64 rest, bool all) const {
    if (rest == 1 && !all) return 1;
    if (all || chunk <= kShortChunk) return chunk;
    return (rest + kShortChunk - 1) / kShortChunk * kShortChunk <= chunk / 2 ? kShortChunk : chunk;
  }

  CompiledGraph& graph(i64 tokens, bool all, const LlamaConfig& c) {
    if (!all && tokens == chunk) return prefill;
    if (!all && tokens == 1) return decode;
    auto it = others.find({tokens, all});
    if (it == others.end()) {
      it = others.emplace(std::pair{tokens, all}, session.compile(build(c, tokens, cache_rows, all, act).graph)).first;
      attach(it->second, c);
      it->second.set_profiling(profiling);
    }
    return it->second;
  }

  // Gives a compiled graph the weights and its cache handles.
  void attach(CompiledGraph& g, const LlamaConfig& c) const {
    // Weights: read in place from the mapping where the dtype matches (the graphs share them), converted otherwise.
    const std::shared_ptr<const void> owner = file;
    for (const auto& [name, shape] : weights) {
      const gguf::TensorView t = file->tensor(name);
      const DType want = c.weight_dtype(name);
      if (gguf::to_dtype(t.info->type) == want) {
        g.share_param(name, ir::TensorView{want, shape, t.bytes.data(), t.bytes.size()}, owner);
      } else {
        ir::Tensor f(DType::F32, shape);
        gguf::dequantize(t.info->type, t.bytes, {f.data_as<float>(), std::size_t(f.numel())});
        g.set_param(name, f);
      }
    }
    // The cache: a handle per layer and kind, written back by every run.
    const ir::Tensor zeros(DType::F32, {c.n_head_kv, cache_rows, c.head_dim});
    for (i64 i = 0; i < c.n_layer; ++i)
      for (const std::string& name : {k_cache(i), v_cache(i)}) {
        g.bind_handle(name, ir::view(zeros));
        g.feed_handle(name, name + ".out");
      }
  }
};

LlamaModel::LlamaModel(LlamaModel&&) noexcept = default;
LlamaModel& LlamaModel::operator=(LlamaModel&&) noexcept = default;
LlamaModel::~LlamaModel() = default;

flow::BuiltModel LlamaModel::build_graph(const LlamaConfig& config, std::int64_t tokens, std::int64_t context,
                                         std::string_view activations) {
  return build(config, tokens, context, true, activations);
}

LlamaModel LlamaModel::load(const std::filesystem::path& path, const LoadOptions& options) {
  return load(std::make_shared<const gguf::File>(gguf::File::open(path)), options);
}

LlamaModel LlamaModel::load(const std::shared_ptr<const gguf::File>& file, const LoadOptions& options) {
  if (!file) throw Error("llm: load needs a GGUF file");
  LlamaModel m;
  m.config_ = LlamaConfig::from_gguf(*file);
  LlamaConfig& c = m.config_;
  m.context_ = options.context > 0 ? options.context : std::min<i64>(c.context, 512);
  if (m.context_ > c.context)
    throw Error(fmt::format("llm: a context of {} exceeds the model's {}", m.context_, c.context));
  if (options.prefill_chunk < 1) throw Error("llm: prefill_chunk must be >= 1");
  const i64 chunk = std::min(options.prefill_chunk, m.context_);

  // Every weight the graph reads, with the shape the metadata gives it (numpy's order: [out, in] for a linear
  // layer) and its dtype there: its block type as stored, f32 for the float types.
  const i64 q = c.n_head * c.head_dim, kv = c.n_head_kv * c.head_dim;
  std::vector<std::pair<std::string, std::vector<i64>>> weights{{"token_embd.weight", {c.vocab, c.n_embd}},
                                                                {"output_norm.weight", {c.n_embd}}};
  if (!c.tied_output) weights.push_back({"output.weight", {c.vocab, c.n_embd}});
  const std::pair<const char*, std::vector<i64>> per_layer[] = {
      {"attn_q.weight", {q, c.n_embd}},        {"attn_k.weight", {kv, c.n_embd}},
      {"attn_v.weight", {kv, c.n_embd}},       {"attn_output.weight", {c.n_embd, q}},
      {"ffn_gate.weight", {c.n_ff, c.n_embd}}, {"ffn_up.weight", {c.n_ff, c.n_embd}},
      {"ffn_down.weight", {c.n_embd, c.n_ff}}, {"attn_norm.weight", {c.n_embd}},
      {"ffn_norm.weight", {c.n_embd}}};
  for (i64 i = 0; i < c.n_layer; ++i)
    for (const auto& [what, shape] : per_layer) weights.push_back({layer_key(i, what), shape});
  for (const auto& [name, shape] : weights) {
    const gguf::TensorView t = file->tensor(name);
    const std::vector<i64> dims(t.info->dims.rbegin(), t.info->dims.rend());
    if (dims != shape)
      throw Error(fmt::format("gguf: tensor '{}' is [{}], the model's metadata needs [{}]", name, fmt::join(dims, ", "),
                              fmt::join(shape, ", ")));
    const auto dtype = gguf::to_dtype(t.info->type);
    if (!dtype)
      throw Error(fmt::format("gguf: tensor '{}' is {}, a type RLX does not read", name, t.info->type_info().name));
    // Vectors (norms) and f16/bf16 matrices are f32 in the graph; a block type stays in its blocks.
    c.weight_dtypes[name] = ir::is_block_quantized(*dtype) && shape.size() == 2 ? *dtype : DType::F32;
  }

  const std::string act = options.exact ? "f32" : "q8";
  Session session(options.device);
  // The cache holds chunk - 1 rows past the context: a padded prefill chunk that starts near the end writes
  // all of its rows (dynamic_update_slice would clamp the start instead), and the mask hides the extra ones.
  const i64 rows = m.context_ + chunk - 1;
  CompiledGraph prefill = session.compile(build(c, chunk, rows, false, act).graph);
  CompiledGraph decode = session.compile(build(c, 1, rows, false, act).graph);
  auto impl = std::make_unique<Impl>(file, std::move(session), act, std::move(weights), std::move(prefill),
                                     std::move(decode), chunk, rows);
  impl->attach(impl->prefill, c);
  impl->attach(impl->decode, c);
  // The short-prompt graph too, so that a chat turn's first token does not wait for a compile.
  if (chunk > Impl::kShortChunk) (void)impl->graph(Impl::kShortChunk, false, c);
  m.impl_ = std::move(impl);
  return m;
}

void LlamaModel::reset() { position_ = 0; }

void LlamaModel::set_profiling(bool on) {
  impl_->profiling = on;
  impl_->prefill.set_profiling(on);
  impl_->decode.set_profiling(on);
  for (auto& [key, g] : impl_->others) g.set_profiling(on);
}

std::vector<runtime::KernelTime> LlamaModel::kernel_times(bool decode) const {
  return (decode ? impl_->decode : *impl_->last_prefill).kernel_times();
}

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
    const i64 T = impl_->tokens_per_run(i64(tokens.size() - done), all_positions);
    CompiledGraph& g = impl_->graph(T, all_positions, config_);
    if (T > 1) impl_->last_prefill = &g;
    const i64 n = std::min<i64>(T, i64(tokens.size() - done)), C = impl_->cache_rows, half = c.head_dim / 2;
    // The cache moves to the graph that runs next.
    if (impl_->cache_owner != &g) {
      for (i64 i = 0; i < c.n_layer; ++i)
        for (const std::string& name : {k_cache(i), v_cache(i)})
          g.bind_handle(name, ir::view(impl_->cache_owner->read_handle(name)));
      impl_->cache_owner = &g;
    }
    ir::Tensor ids(DType::I32, {T}), cos(DType::F32, {T, half}), sin(DType::F32, {T, half});
    ir::Tensor start(DType::I32, {1}), mask(DType::Bool, {1, 1, T, C});
    start.data_as<std::int32_t>()[0] = std::int32_t(position_);
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
      for (i64 j = 0; j < C; ++j) m[t * C + j] = j <= pos;  // a padding row attends to position 0 only
    }
    std::vector<runtime::NamedTensor> in{{"tokens", ir::view(ids)},
                                         {"rope_cos", ir::view(cos)},
                                         {"rope_sin", ir::view(sin)},
                                         {"kv_pos", ir::view(start)},
                                         {"mask", ir::view(mask)}};
    ir::Tensor last(DType::F32, {1, T});
    if (!all_positions) {
      last.data_as<float>()[n - 1] = 1;  // the chunk's last real token
      in.push_back({"last", ir::view(last)});
    }
    const std::vector<std::size_t> logits_only{0};
    const ir::Tensor logits = g.run_read_outputs(in, logits_only)[0];
    const float* p = logits.data_as<float>();
    if (all_positions) {
      out.insert(out.end(), p, p + n * c.vocab);
    } else if (done + std::size_t(n) == tokens.size()) {
      out.assign(p, p + c.vocab);
    }
    done += std::size_t(n);
    position_ += n;
  }
  return out;
}

}  // namespace rlx::llm
