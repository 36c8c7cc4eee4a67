// Random DAGs of elementwise, reduce, matmul and movement ops through the
// whole pipeline (fusion, memory planning, views) against the reference.
// Each graph is a pure function of its seed, test_seed() + index, so a
// failure replays with RLX_TEST_SEED; the seed and graph text are printed.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "conformance/harness.hpp"
#include "rlx/codegen/c.hpp"

namespace rlx::conformance {
namespace {

using ir::DType;
using ir::Graph;
using ir::NodeId;
using ir::OpKind;
using ir::Shape;

constexpr std::int64_t kMaxElements = 4096;
constexpr std::size_t kMaxRank = 5;
// Operands above this bound are squashed with tanh/sigmoid first, so that
// values stay where f32 tolerances are meaningful.
constexpr double kMaxMagnitude = 8;

class RandomGraph {
 public:
  explicit RandomGraph(std::uint64_t seed) : rng_(seed), g_("random_" + std::to_string(seed)) {}

  Graph build() {
    int n_inputs = pick(1, 3);
    for (int i = 0; i < n_inputs; ++i) {
      Ints s = random_shape();
      std::string name = "x" + std::to_string(i);
      // Occasionally a param: its value is set once and reused across runs.
      NodeId id = i > 0 && chance(0.15) ? g_.param(name, Shape(s)) : g_.input(name, Shape(s));
      pool_.push_back({id, 2});
    }
    int n_ops = pick(2, 12);
    for (int i = 0; i < n_ops; ++i) step();
    // Outputs: the newest value plus up to two others (possibly still consumed, or an input).
    std::vector<NodeId> outs{pool_.back().id};
    for (int extra = pick(0, 2); extra > 0; --extra) {
      NodeId id = pool_[std::size_t(pick(0, int(pool_.size()) - 1))].id;
      if (std::find(outs.begin(), outs.end(), id) == outs.end()) outs.push_back(id);
    }
    for (auto id : outs) g_.add_output(id);
    return std::move(g_);
  }

 private:
  struct Val {
    NodeId id;
    double mag;  // a bound on |value|
  };

  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  double real(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }
  Ints shape(const Val& v) const { return g_.node(v.id).shape.extents(); }
  static std::int64_t numel(const Ints& s) {
    return std::accumulate(s.begin(), s.end(), std::int64_t{1}, std::multiplies<>());
  }
  const Val& any() { return pool_[std::size_t(pick(0, int(pool_.size()) - 1))]; }
  // Recent values are likelier operands, so graphs grow deep as well as wide.
  const Val& recent() { return chance(0.6) ? pool_.back() : any(); }

  std::int64_t extent() { return chance(0.2) ? 1 : pick(1, 8); }
  Ints random_shape() {
    Ints s(std::size_t(pick(0, 4)));
    for (auto& d : s) d = extent();
    return s;
  }

  void push(NodeId id, double mag) { pool_.push_back({id, mag}); }
  Val squash(Val v) {
    if (v.mag <= kMaxMagnitude) return v;
    return {chance(0.5) ? g_.unary(OpKind::Tanh, v.id) : g_.unary(OpKind::Sigmoid, v.id), 1};
  }
  // |x| + 1: a safe argument for log, sqrt, rsqrt, reciprocal and divisors.
  NodeId at_least_one(NodeId x) { return g_.add(g_.unary(OpKind::Abs, x), g_.scalar(1)); }
  NodeId constant(const Ints& s, double lo, double hi) {
    return g_.constant(testing::random_tensor(DType::F32, s, rng_, lo, hi));
  }

  void step() {
    switch (pick(0, 9)) {
      case 0:
      case 1:
      case 2: unary(); break;
      case 3:
      case 4:
      case 5: binary(); break;
      case 6: reduce(); break;
      case 7: matmul(); break;
      default: movement(); break;
    }
  }

  void unary() {
    static constexpr OpKind kOps[] = {OpKind::Neg,   OpKind::Abs,        OpKind::Exp,  OpKind::Log,      OpKind::Sqrt,
                                      OpKind::Rsqrt, OpKind::Reciprocal, OpKind::Tanh, OpKind::Sigmoid,  OpKind::Relu,
                                      OpKind::Gelu,  OpKind::GeluTanh,   OpKind::Silu, OpKind::Softplus, OpKind::Erf,
                                      OpKind::Sin,   OpKind::Cos};
    OpKind op = kOps[pick(0, int(std::size(kOps)) - 1)];
    Val x = recent();
    switch (op) {
      case OpKind::Exp:
        if (x.mag > 2) x = {g_.unary(OpKind::Tanh, x.id), 1};
        push(g_.exp(x.id), std::exp(x.mag));
        return;
      case OpKind::Log:
      case OpKind::Sqrt:
      case OpKind::Rsqrt:
      case OpKind::Reciprocal: {
        NodeId y = g_.unary(op, at_least_one(x.id));
        push(y, op == OpKind::Log ? std::log1p(x.mag) : op == OpKind::Sqrt ? std::sqrt(x.mag + 1) : 1);
        return;
      }
      case OpKind::Tanh:
      case OpKind::Sigmoid:
      case OpKind::Erf:
      case OpKind::Sin:
      case OpKind::Cos: push(g_.unary(op, x.id), 1); return;
      default: push(g_.unary(op, x.id), x.mag + 1); return;
    }
  }

  // A shape that broadcasts against `s`: some dims set to 1, some leading ones dropped.
  Ints broadcastable_to(const Ints& s) {
    Ints b = s;
    for (auto& d : b)
      if (chance(0.4)) d = 1;
    auto drop = std::size_t(pick(0, int(b.size())));
    b.erase(b.begin(), b.begin() + std::ptrdiff_t(drop));
    return b;
  }
  static bool broadcasts(const Ints& a, const Ints& b) {
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      auto x = a[a.size() - 1 - i], y = b[b.size() - 1 - i];
      if (x != y && x != 1 && y != 1) return false;
    }
    Ints out(std::max(a.size(), b.size()));
    for (std::size_t i = 0; i < out.size(); ++i) {
      auto x = i < a.size() ? a[a.size() - 1 - i] : 1, y = i < b.size() ? b[b.size() - 1 - i] : 1;
      out[i] = std::max(x, y);
    }
    return numel(out) <= kMaxElements;
  }

  void binary() {
    Val a = squash(recent());
    Ints sa = shape(a);
    Val b;
    std::vector<const Val*> partners;
    for (const auto& v : pool_)
      if (broadcasts(sa, shape(v))) partners.push_back(&v);
    switch (pick(0, 3)) {
      case 0: b = squash(*partners[std::size_t(pick(0, int(partners.size()) - 1))]); break;  // a itself qualifies
      case 1: b = {constant(broadcastable_to(sa), -2, 2), 2}; break;
      case 2: b = {g_.scalar(real(-2, 2)), 2}; break;
      default:  // a reduction of a itself, kept broadcastable
        if (sa.empty()) {
          b = a;
        } else {
          auto axis = std::int64_t(pick(0, int(sa.size()) - 1));
          b = {g_.mean(a.id, {axis}, true), a.mag};
        }
    }
    if (chance(0.5)) std::swap(a, b);
    static constexpr OpKind kOps[] = {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div,
                                      OpKind::Max, OpKind::Min, OpKind::Pow};
    switch (OpKind op = kOps[pick(0, int(std::size(kOps)) - 1)]) {
      case OpKind::Div: push(g_.div(a.id, at_least_one(b.id)), a.mag); return;
      case OpKind::Pow: {
        // A base in [0.5, 1.5] and an exponent in [-1, 1].
        NodeId base = g_.add(g_.unary(OpKind::Sigmoid, a.id), g_.scalar(0.5));
        push(g_.binary(op, base, g_.unary(OpKind::Tanh, b.id)), 2);
        return;
      }
      case OpKind::Mul: push(g_.mul(a.id, b.id), a.mag * b.mag); return;
      case OpKind::Max:
      case OpKind::Min: push(g_.binary(op, a.id, b.id), std::max(a.mag, b.mag)); return;
      default: push(g_.binary(op, a.id, b.id), a.mag + b.mag); return;
    }
  }

  void reduce() {
    Val x = squash(recent());
    Ints s = shape(x);
    if (s.empty()) return unary();
    Ints axes;
    for (std::size_t d = 0; d < s.size(); ++d)
      if (chance(0.5)) axes.push_back(std::int64_t(d) - (chance(0.3) ? std::int64_t(s.size()) : 0));
    if (axes.empty()) axes.push_back(pick(0, int(s.size()) - 1));
    std::int64_t count = 1;
    for (auto a : axes) count *= s[std::size_t(a < 0 ? a + std::int64_t(s.size()) : a)];
    bool keep = chance(0.5);
    switch (pick(0, 4)) {
      case 0: push(g_.sum(x.id, axes, keep), x.mag * double(count)); return;
      case 1: push(g_.mean(x.id, axes, keep), x.mag); return;
      case 2: push(g_.reduce(OpKind::ReduceMax, x.id, axes, keep), x.mag); return;
      case 3: push(g_.reduce(OpKind::ReduceMin, x.id, axes, keep), x.mag); return;
      default: {
        if (count > 16) {
          push(g_.sum(x.id, axes, keep), x.mag * double(count));
          return;
        }
        // Factors in [0.5, 1.5] over at most 16 elements stay below 1.5^16.
        NodeId f = g_.add(g_.unary(OpKind::Sigmoid, x.id), g_.scalar(0.5));
        push(g_.reduce(OpKind::ReduceProd, f, axes, keep), std::pow(1.5, double(count)));
      }
    }
  }

  void matmul() {
    std::vector<const Val*> lhs;
    for (const auto& v : pool_)
      if (g_.node(v.id).shape.rank() >= 2) lhs.push_back(&v);
    Val a = lhs.empty() ? recent() : *lhs[std::size_t(pick(0, int(lhs.size()) - 1))];
    if (g_.node(a.id).shape.rank() < 2) a.id = g_.reshape(a.id, chance(0.5) ? Ints{-1, 1} : Ints{1, -1});
    if (a.mag > 2) a = {g_.unary(OpKind::Tanh, a.id), 1};
    Ints sa = shape(a);
    std::int64_t k = sa.back();
    Ints batch(sa.begin(), sa.end() - 2);
    Val b;
    int how = pick(0, 2);
    if (how == 0) {  // a @ a^T
      b = {g_.transpose(a.id), a.mag};
    } else {
      std::int64_t n = extent();
      Ints sb{k, n};
      if (how == 2 && !batch.empty()) {  // batched, broadcasting against a's batch
        sb = broadcastable_to(batch);
        sb.insert(sb.end(), {k, n});
      }
      b = {constant(sb, -1, 1), 1};
    }
    if (numel(batch) * sa[sa.size() - 2] * shape(b).back() > kMaxElements) return unary();
    if (chance(0.5)) {
      push(g_.matmul(a.id, b.id), a.mag * b.mag * double(k));
    } else {  // an epilogue the backend may fuse: bias add and activation
      NodeId y = g_.add(g_.matmul(a.id, b.id), constant({shape(b).back()}, -1, 1));
      push(chance(0.5) ? g_.relu(y) : y, a.mag * b.mag * double(k) + 1);
    }
  }

  void movement() {
    Val x = recent();
    Ints s = shape(x);
    std::size_t r = s.size();
    switch (pick(0, 6)) {
      case 0: {  // reshape: flatten, merge two dims, split one, or add a 1
        Ints t;
        int how = pick(0, 3);
        if (how == 0 || r == 0) {
          t = {numel(s)};
        } else if (how == 1 && r >= 2) {
          auto d = std::size_t(pick(0, int(r) - 2));
          t = s;
          t[d] *= t[d + 1];
          t.erase(t.begin() + std::ptrdiff_t(d) + 1);
        } else if (how == 2 && r < kMaxRank) {
          auto d = std::size_t(pick(0, int(r) - 1));
          std::int64_t f = s[d] % 2 == 0 ? 2 : s[d] % 3 == 0 ? 3 : 1;
          t = s;
          t[d] /= f;
          t.insert(t.begin() + std::ptrdiff_t(d), f);
        } else {
          t = s;
          if (r < kMaxRank) t.insert(t.begin() + pick(0, int(r)), 1);
        }
        push(g_.reshape(x.id, Shape(t)), x.mag);
        return;
      }
      case 1: {  // permute
        if (r < 2) return binary();
        Ints perm(r);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng_);
        push(g_.permute(x.id, perm), x.mag);
        return;
      }
      case 2: {  // slice one or two axes, with steps; occasionally negative starts
        if (r == 0) return unary();
        Ints axes, starts, ends, steps;
        for (std::size_t d = 0; d < r; ++d) {
          if (s[d] < 2 || (!axes.empty() && !chance(0.3))) continue;
          auto st = std::int64_t(pick(0, int(s[d]) - 1));
          auto en = std::int64_t(pick(int(st) + 1, int(s[d])));
          axes.push_back(std::int64_t(d));
          starts.push_back(chance(0.2) ? st - s[d] : st);
          ends.push_back(en);
          steps.push_back(pick(1, 3));
        }
        if (axes.empty()) return unary();
        push(g_.slice(x.id, axes, starts, ends, steps), x.mag);
        return;
      }
      case 3: {  // concat with itself, a negation of itself, or a same-shaped value
        if (r == 0 || 2 * numel(s) > kMaxElements) return unary();
        auto axis = std::int64_t(pick(0, int(r) - 1));
        std::vector<NodeId> parts{x.id};
        double mag = x.mag;
        for (int i = pick(1, 2); i > 0; --i) {
          const Val& o = any();
          Ints so = shape(o);
          bool fits = so.size() == r && numel(s) + numel(so) <= kMaxElements;
          for (std::size_t d = 0; fits && d < r; ++d) fits = std::int64_t(d) == axis || so[d] == s[d];
          NodeId part = fits ? o.id : chance(0.5) ? x.id : g_.unary(OpKind::Neg, x.id);
          mag = std::max(mag, fits ? o.mag : x.mag);
          parts.push_back(part);
        }
        std::int64_t total = 0;
        for (auto p : parts) total += g_.node(p).shape.numel();
        if (total > kMaxElements) return unary();
        push(g_.concat(parts, axis - (chance(0.3) ? std::int64_t(r) : 0)), mag);
        return;
      }
      case 4: {  // pad by 0..2 on each side, sometimes cropping by 1
        if (r == 0) return unary();
        Ints pads(2 * r, 0);
        std::int64_t grown = 1;
        for (std::size_t d = 0; d < r; ++d) {
          if (chance(0.5)) {
            pads[d] = pick(s[d] >= 2 ? -1 : 0, 2);
            pads[d + r] = pick(s[d] + pads[d] >= 2 ? -1 : 0, 2);
          }
          grown *= s[d] + pads[d] + pads[d + r];
        }
        if (grown > kMaxElements) return unary();
        double value = real(-1, 1);
        push(g_.pad(x.id, pads, value), std::max(x.mag, 1.0));
        return;
      }
      case 5: {  // expand size-1 dims, or prepend one
        Ints t = s;
        bool any1 = false;
        for (auto& d : t) {
          if (d != 1 || !chance(0.7)) continue;
          d = pick(2, 4);
          any1 = true;
        }
        if ((!any1 || chance(0.3)) && r < kMaxRank) t.insert(t.begin(), pick(2, 3));
        if (numel(t) > kMaxElements) return unary();
        push(g_.expand(x.id, Shape(t)), x.mag);
        return;
      }
      default: {  // flip
        if (r == 0) return unary();
        Ints axes;
        for (std::size_t d = 0; d < r; ++d)
          if (chance(0.5)) axes.push_back(std::int64_t(d));
        if (axes.empty()) axes.push_back(pick(0, int(r) - 1));
        push(g_.flip(x.id, axes), x.mag);
        return;
      }
    }
  }

  std::mt19937_64 rng_;
  Graph g_;
  std::vector<Val> pool_;
};

enum class Mode { Default, NoFusion, NoOptimize };

struct Shard {
  Mode mode;
  int first, count;
};
void PrintTo(const Shard& s, std::ostream* os) {
  *os << (s.mode == Mode::Default    ? "default"
          : s.mode == Mode::NoFusion ? "nofusion"
                                     : "nooptimize")
      << " graphs [" << s.first << ", " << s.first + s.count << ")";
}

class RandomGraphs : public ::testing::TestWithParam<std::tuple<Device, Shard>> {
 protected:
  void SetUp() override {
    if (auto why = unavailable_reason(std::get<0>(GetParam())); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(RandomGraphs, MatchReference) {
  auto [device, shard] = GetParam();
  // Every graph here is new (the seed changes per run), so under mx::compile each of its fused kernels would be
  // new C++ for MLX's CPU device to build with the system compiler, about a second each over 700 graphs. MLX runs
  // them lazily: the same lowering and segments, evaluated without mx::compile. The op-parity suite and
  // tests/mlx run the default, compiled mode (their graphs are fixed, so MLX's kernel cache keeps them).
  std::optional<env::ScopedOverride> lazy;
  if (device == Device::Mlx) lazy.emplace("RLX_MLX_MODE", "lazy");
  for (int i = shard.first; i < shard.first + shard.count; ++i) {
    std::uint64_t seed = testing::test_seed() + std::uint64_t(i);
    Graph g;
    try {
      g = RandomGraph(seed).build();
    } catch (const std::exception& e) {  // a generator bug, not a backend one
      FAIL() << "graph " << i << " (seed " << seed << "): building threw " << e.what();
    }
    Check check;
    check.seed = seed;
    check.options.fusion = shard.mode != Mode::NoFusion;
    check.options.optimize = shard.mode != Mode::NoOptimize;
    check.label = "random graph " + std::to_string(i) + " (RLX_TEST_SEED=" + std::to_string(testing::test_seed()) + ")";
    EXPECT_TRUE(matches_reference(device, g, check));
  }
}

// 10 shards of 50 graphs with the default options; the first 100 graphs again
// without fusion and without optimization.
std::vector<Shard> shards() {
  std::vector<Shard> s;
  for (int i = 0; i < 10; ++i) s.push_back({Mode::Default, 50 * i, 50});
  for (Mode m : {Mode::NoFusion, Mode::NoOptimize})
    for (int i = 0; i < 2; ++i) s.push_back({m, 50 * i, 50});
  return s;
}

std::string shard_name(const ::testing::TestParamInfo<RandomGraphs::ParamType>& info) {
  const Shard& shard = std::get<1>(info.param);
  const char* mode = shard.mode == Mode::Default ? "default" : shard.mode == Mode::NoFusion ? "nofusion" : "nooptimize";
  return std::string(runtime::device_label(std::get<0>(info.param))) + "_" + mode + "_" +
         std::to_string(shard.first / 50);
}

INSTANTIATE_TEST_SUITE_P(Conformance, RandomGraphs,
                         ::testing::Combine(::testing::ValuesIn(backends()), ::testing::ValuesIn(shards())),
                         shard_name);

// ---- generated C ----------------------------------------------------------------
// The same graphs through the C target (rlx::codegen::c): each is compiled for
// codegen::c::traits() with the shard's options and emitted from its LIR, and
// a shard's graphs are built into one shared object by one `cc` run. Random
// graphs reach fusion shapes the op-parity variants do not (reduce prologues
// and epilogues, matmul epilogues, kernels with several outputs, views between
// kernels), so they check that the C runs its LIR as it is.
class RandomGraphsThroughC : public ::testing::TestWithParam<Shard> {
 protected:
  void SetUp() override {
    if (!testing::have_c_compiler())
      GTEST_SKIP() << "no C compiler: '" << testing::c_compiler() << " --version' failed";
  }
};

TEST_P(RandomGraphsThroughC, MatchReference) {
  const Shard& shard = GetParam();
  std::vector<Graph> graphs;
  std::vector<codegen::c::Source> sources;
  for (int i = shard.first; i < shard.first + shard.count; ++i) {
    std::uint64_t seed = testing::test_seed() + std::uint64_t(i);
    graphs.push_back(RandomGraph(seed).build());
    compile::CompileOptions options;
    options.fusion = shard.mode != Mode::NoFusion;
    options.optimize = shard.mode != Mode::NoOptimize;
    codegen::c::Options c;
    c.function_name = "random_graph_" + std::to_string(i);
    sources.push_back(codegen::c::emit(compile::compile(graphs.back(), codegen::c::traits(), options).lir, c));
  }
  testing::CModule module(std::move(sources), "-O1");
  ASSERT_TRUE(module.error().empty()) << module.error();
  for (std::size_t k = 0; k < graphs.size(); ++k) {
    Check check;
    check.seed = testing::test_seed() + std::uint64_t(shard.first) + k;
    check.label = "random graph " + std::to_string(shard.first + int(k)) +
                  " (generated C, RLX_TEST_SEED=" + std::to_string(testing::test_seed()) + ")";
    EXPECT_TRUE(matches_reference([&] { return c_executor(module, k); }, graphs[k], graphs[k], check));
  }
}

// The first 100 graphs with the default options, the first 50 without fusion.
INSTANTIATE_TEST_SUITE_P(Conformance, RandomGraphsThroughC,
                         ::testing::Values(Shard{Mode::Default, 0, 50}, Shard{Mode::Default, 50, 50},
                                           Shard{Mode::NoFusion, 0, 50}),
                         [](const auto& info) {
                           return std::string(info.param.mode == Mode::Default ? "default_" : "nofusion_") +
                                  std::to_string(info.param.first / 50);
                         });

}  // namespace
}  // namespace rlx::conformance
