// Op parity: every op in ir::kAllOps, in every dtype it takes, on broadcast
// and edge shapes (size-1 dims, zero-size tensors, rank 0), against the
// float64 reference. Graphs with composites run twice: through the pipeline
// as built (native where the backend claims the op) and decomposed to
// primitives first. Every variant also runs through the C codegen target.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string_view>

#include "backends/cuda/attention.hpp"
#include "backends/cuda/quant.hpp"
#include "conformance/harness.hpp"
#include "conformance/parity_block_types.hpp"
#include "conformance/parity_storage_types.hpp"
#include "conformance/parity_variant.hpp"
#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/codegen/c.hpp"
#include "rlx/ir/control_flow.hpp"
#include "support/c_module.hpp"
#include "support/test_ops.hpp"

namespace rlx::conformance {
namespace {

using ir::DType;
using ir::Graph;
using ir::NodeId;
using ir::OpKind;
using ir::Shape;

constexpr DType kFloats[] = {DType::F32, DType::F16, DType::BF16, DType::F64};

// Some NaNs among ordinary values: max/min-like ops must propagate them, as the reference does.
Gen with_nans() { return one_of({std::numeric_limits<double>::quiet_NaN(), -1.5, -0.0, 0.5, 2}); }

// ---- leaves ------------------------------------------------------------------

Variants input_variants() {
  Variants r;
  for (DType t : {DType::F32, DType::F16, DType::I64, DType::Bool, DType::U8}) {
    for (const Ints& s : {Ints{}, Ints{3, 4}, Ints{0, 2}}) {
      V v("input passthrough " + dt(t) + str(s));
      auto x = v.in("x", t, s);
      r.push_back(v.out({x, x}));  // the same buffer read out twice
    }
  }
  return r;
}

Variants param_variants() {
  Variants r;
  for (DType t : {DType::F32, DType::F16, DType::I32}) {
    V v("param " + dt(t));
    auto x = v.in("x", t, {2, 3});
    auto w = v.g().param("w", Shape{3}, t);
    r.push_back(v.out({w, v.g().mul(x, w)}));
  }
  return r;
}

Variants constant_variants() {
  Variants r;
  std::mt19937_64 rng(7);
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64, DType::I8, DType::Bool}) {
    V v("constant " + dt(t));
    auto c = v.g().constant(testing::random_tensor(t, {2, 3}, rng, -5, 5));
    auto x = v.in("x", t, {3});
    auto y = t == DType::Bool ? v.g().binary(OpKind::And, c, x) : v.g().add(c, x);
    r.push_back(v.out({c, y, v.g().scalar(3, t)}));
  }
  return r;
}

Variants iota_variants() {
  Variants r;
  for (DType t : {DType::I64, DType::I32, DType::F32, DType::F16}) {
    for (std::int64_t axis : {0, 1, -1}) {
      V v("iota " + dt(t) + " axis " + std::to_string(axis));
      auto i = v.g().iota(Shape{3, 5}, axis, t);
      auto x = v.in("x", t, {3, 5});
      r.push_back(v.out({i, v.g().add(i, x)}));
    }
  }
  V v("iota rank 1 and zero-size");
  r.push_back(v.out({v.g().iota(Shape{7}, 0), v.g().iota(Shape{0, 3}, 1)}));
  return r;
}

Variants random_variants(OpKind op) {
  Variants r;
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    for (const Ints& s : {Ints{5, 7}, Ints{300}, Ints{0}}) {
      V v(std::string(ir::op_name(op)) + " " + dt(t) + str(s));
      auto n = op == OpKind::RandomUniform ? v.g().random_uniform(Shape(s), 42, -1.5, 3.0, t)
                                           : v.g().random_normal(Shape(s), 43, 0.5, 2.0, t);
      auto x = v.in("x", t, s);
      r.push_back(v.out({n, v.g().add(n, x)}));
    }
  }
  return r;
}

// ---- elementwise -------------------------------------------------------------

const std::vector<Ints> kUnaryShapes = {{}, {1}, {7}, {2, 3}, {0, 3}, {3, 1, 5}, {2, 3, 4, 5}};
// Large enough for the vectorized and multithreaded paths, with a ragged tail.
const Ints kLarge = {256, 257};

Gen unary_domain(OpKind op) {
  switch (op) {
    case OpKind::Log:
    case OpKind::Sqrt:
    case OpKind::Rsqrt: return uniform(0.05, 4);
    case OpKind::Reciprocal: return nonzero(0.1, 4);
    case OpKind::Softplus: return uniform(-8, 8);
    default: return uniform(-4, 4);
  }
}

Variants unary_variants(OpKind op) {
  Variants r;
  bool int_ok = op == OpKind::Neg || op == OpKind::Abs || op == OpKind::Relu || op == OpKind::Sign ||
                op == OpKind::Floor || op == OpKind::Ceil || op == OpKind::Round;
  for (DType t : kFloats) {
    auto shapes = kUnaryShapes;
    if (t == DType::F32) shapes.push_back(kLarge);
    for (const auto& s : shapes) {
      V v(std::string(ir::op_name(op)) + " " + dt(t) + str(s));
      r.push_back(v.out({v.g().unary(op, v.in("x", t, s, unary_domain(op)))}));
    }
    // Exact ties: halves for round (to even), integers for floor/ceil, zeros for sign.
    if (op == OpKind::Round || op == OpKind::Floor || op == OpKind::Ceil || op == OpKind::Sign) {
      V v(std::string(ir::op_name(op)) + " " + dt(t) + " ties");
      r.push_back(
          v.out({v.g().unary(op, v.in("x", t, {4, 8}, one_of({-2.5, -1.5, -1, -0.5, -0.0, 0, 0.5, 1, 1.5, 2.5, 3})))}));
    }
    if (op == OpKind::Relu || op == OpKind::Sign || op == OpKind::Abs) {
      V v(std::string(ir::op_name(op)) + " " + dt(t) + " NaN propagates");
      r.push_back(v.out({v.g().unary(op, v.in("x", t, {4, 8}, with_nans()))}));
    }
  }
  if (int_ok) {
    for (DType t : {DType::I32, DType::I64, DType::I8}) {
      for (const Ints& s : {Ints{}, Ints{7}, Ints{3, 4}}) {
        V v(std::string(ir::op_name(op)) + " " + dt(t) + str(s));
        r.push_back(v.out({v.g().unary(op, v.in("x", t, s, ints_in(-100, 100)))}));
      }
    }
  }
  return r;
}

Variants not_variants() {
  Variants r;
  for (const Ints& s : {Ints{}, Ints{7}, Ints{3, 4}, Ints{0}}) {
    V v("not " + str(s));
    r.push_back(v.out({v.g().unary(OpKind::Not, v.in("x", DType::Bool, s))}));
  }
  return r;
}

using ShapePair = std::pair<Ints, Ints>;
const std::vector<ShapePair> kBroadcastPairs = {
    {{2, 3}, {2, 3}}, {{2, 3}, {3}},    {{3}, {2, 3}}, {{2, 1, 4}, {3, 1}}, {{}, {2, 3}}, {{2, 3}, {}},
    {{4, 1}, {1, 5}}, {{0, 3}, {1, 3}}, {{}, {}},      {{1}, {2, 1, 1, 3}}};

std::pair<Gen, Gen> float_binary_domain(OpKind op) {
  switch (op) {
    case OpKind::Div: return {uniform(-4, 4), nonzero(0.25, 4)};
    case OpKind::Pow: return {uniform(0.1, 3), uniform(-2, 2)};  // positive base
    case OpKind::Mod: return {uniform(-6, 6), nonzero(0.5, 3)};
    default: return {uniform(-4, 4), uniform(-4, 4)};
  }
}

std::pair<Gen, Gen> int_binary_domain(OpKind op, DType t) {
  bool narrow = t == DType::I8 || t == DType::U8;
  Gen wide = t == DType::U8 ? ints_in(0, 255) : t == DType::I8 ? ints_in(-128, 127) : ints_in(-1000, 1000);
  switch (op) {
    // Truncating division and a divisor-signed modulo show on mixed signs; no zero divisors.
    case OpKind::Div:
    case OpKind::Mod:
      return {narrow ? wide : ints_in(-20, 20),
              t == DType::U8 ? one_of({1, 2, 3, 7}) : one_of({-5, -3, -2, -1, 1, 2, 3, 7})};
    case OpKind::Pow: return {ints_in(-3, 3), ints_in(0, 5)};
    default: return {wide, wide};  // narrow types wrap around
  }
}

Variants binary_variants(OpKind op) {
  Variants r;
  auto add = [&](DType t, const ShapePair& s, const std::pair<Gen, Gen>& gens) {
    V v(std::string(ir::op_name(op)) + " " + dt(t) + str(s.first) + " x " + str(s.second));
    auto a = v.in("a", t, s.first, gens.first);
    auto b = v.in("b", t, s.second, gens.second);
    r.push_back(v.out({v.g().binary(op, a, b)}));
  };
  for (DType t : kFloats) {
    for (const auto& s : kBroadcastPairs) add(t, s, float_binary_domain(op));
    if (t == DType::F32) {
      add(t, {kLarge, {257}}, float_binary_domain(op));
      add(t, {{256, 1}, {1, 257}}, float_binary_domain(op));
    }
  }
  if (op == OpKind::Max || op == OpKind::Min)
    for (DType t : kFloats) add(t, {{4, 8}, {8}}, {with_nans(), with_nans()});
  // Exact multiples of every sign combination: the remainder is a zero with the divisor's sign, never +-b.
  if (op == OpKind::Mod)
    for (DType t : kFloats)
      add(t, {{6, 1}, {1, 4}},
          {cycle_of({-3.09375, 3.09375, -6, 6, 7.5, -7.5}), cycle_of({-1.03125, 1.03125, 1.5, -2.5})});
  std::vector<DType> ints = {DType::I32, DType::I64};
  if (op != OpKind::Pow) ints.insert(ints.end(), {DType::I8, DType::U8});
  for (DType t : ints)
    for (const ShapePair& s :
         {ShapePair{{2, 3}, {3}}, ShapePair{{}, {4}}, ShapePair{{3, 1}, {1, 4}}, ShapePair{{64}, {64}}})
      add(t, s, int_binary_domain(op, t));
  for (auto& v : wide_int_binary_variants(op)) r.push_back(std::move(v));
  return r;
}

Variants compare_variants(OpKind op) {
  Variants r;
  std::vector<DType> types = {DType::F32, DType::F16, DType::BF16, DType::F64,
                              DType::I32, DType::I64, DType::I8,   DType::U8};
  if (op == OpKind::Eq || op == OpKind::Ne) types.push_back(DType::Bool);
  for (DType t : types) {
    // A small value set makes ties, where lt/le and eq/ne differ, common.
    Gen gen = t == DType::Bool ? bools() : ir::is_float(t) ? one_of({-1, -0.5, 0, 0.5, 1}) : ints_in(0, 3);
    for (const ShapePair& s : {ShapePair{{2, 3}, {2, 3}}, ShapePair{{2, 3}, {3}}, ShapePair{{}, {5}},
                               ShapePair{{4, 1}, {1, 3}}, ShapePair{{0}, {1}}}) {
      V v(std::string(ir::op_name(op)) + " " + dt(t) + str(s.first) + " x " + str(s.second));
      auto a = v.in("a", t, s.first, gen);
      auto b = v.in("b", t, s.second, gen);
      r.push_back(v.out({v.g().binary(op, a, b)}));
    }
  }
  for (auto& v : wide_int_compare_variants(op)) r.push_back(std::move(v));
  return r;
}

Variants logical_variants(OpKind op) {
  Variants r;
  for (const ShapePair& s : {ShapePair{{2, 3}, {2, 3}}, ShapePair{{2, 3}, {3}}, ShapePair{{}, {5}},
                             ShapePair{{4, 1}, {1, 3}}, ShapePair{{0}, {}}}) {
    V v(std::string(ir::op_name(op)) + str(s.first) + " x " + str(s.second));
    auto a = v.in("a", DType::Bool, s.first);
    auto b = v.in("b", DType::Bool, s.second);
    r.push_back(v.out({v.g().binary(op, a, b)}));
  }
  return r;
}

Variants where_variants() {
  Variants r;
  for (DType t : ir::kAllDTypes) {
    for (const auto& [c, a, b] : std::vector<std::tuple<Ints, Ints, Ints>>{
             {{3, 4}, {3, 4}, {3, 4}}, {{2, 1, 3}, {4, 1}, {}}, {{}, {2, 3}, {3}}, {{0, 2}, {1, 2}, {2}}}) {
      V v("where " + dt(t) + str(c) + " " + str(a) + " " + str(b));
      auto cond = v.in("c", DType::Bool, c);
      r.push_back(v.out({v.g().where(cond, v.in("a", t, a), v.in("b", t, b))}));
    }
  }
  return r;
}

// Values every (from, to) pair converts without undefined behaviour: float to
// integer stays in the target's range; integer to integer wraps around.
Gen cast_domain(DType from, DType to) {
  if (from == DType::Bool) return bools();
  if (from == DType::U8) return ints_in(0, 255);
  if (from == DType::I8) return ints_in(-128, 127);
  // Unsigned values the float64 reference holds exactly (a negative one would wrap past 2^53).
  if (ir::is_unsigned(from)) return to == DType::Bool ? ints_in(0, 2) : ints_in(0, 1000);
  if (ir::is_integer(from)) return to == DType::Bool ? ints_in(-2, 2) : ints_in(-1000, 1000);
  switch (to) {
    case DType::U8: return uniform(0, 250);
    case DType::I8: return uniform(-120, 120);
    case DType::Bool: return one_of({0, -0.0, 0.25, -3, 1e-3, 0});
    default: return uniform(-1000, 1000);
  }
}

Variants cast_variants() {
  Variants r;
  for (DType from : ir::kAllDTypes)
    for (DType to : ir::kAllDTypes) {
      V v("cast " + dt(from) + " -> " + dt(to));
      r.push_back(v.out({v.g().cast(v.in("x", from, {4, 9}, cast_domain(from, to)), to)}));
    }
  for (const Ints& s : {Ints{}, Ints{0, 3}, kLarge}) {
    V v("cast f32 -> f16 " + str(s));
    r.push_back(v.out({v.g().cast(v.in("x", DType::F32, s), DType::F16)}));
  }
  for (auto& v : storage_cast_variants()) r.push_back(std::move(v));
  return r;
}

Variants clamp_variants() {
  Variants r;
  for (DType t : kFloats)
    for (const Ints& s : {Ints{}, Ints{3, 4}, Ints{0}}) {
      V v("clamp " + dt(t) + str(s));
      r.push_back(v.out({v.g().clamp(v.in("x", t, s), -0.5, 1.25)}));
    }
  V nan("clamp f32 NaN propagates");
  r.push_back(nan.out({nan.g().clamp(nan.in("x", DType::F32, {4, 8}, with_nans()), -0.5, 1.25)}));
  // A NaN bound makes every element NaN, as numpy's clip does (the reference is the judge).
  const double q = std::nan("");
  for (DType t : kFloats)
    for (auto [lo, hi] : {std::pair{q, 1.0}, std::pair{-1.0, q}, std::pair{q, q}}) {
      V v("clamp " + dt(t) + " NaN bound " + std::to_string(lo) + "," + std::to_string(hi));
      r.push_back(v.out({v.g().clamp(v.in("x", t, {3, 5}), lo, hi)}));
    }
  for (DType t : {DType::I32, DType::I64, DType::I8}) {
    V v("clamp " + dt(t));
    r.push_back(v.out({v.g().clamp(v.in("x", t, {3, 4}, ints_in(-10, 10)), -3, 5)}));
  }
  return r;
}

// ---- reductions and matmul ---------------------------------------------------

Variants reduce_variants(OpKind op) {
  Variants r;
  bool prod = op == OpKind::ReduceProd;
  std::vector<DType> types(std::begin(kFloats), std::end(kFloats));
  if (op != OpKind::ReduceMean) types.insert(types.end(), {DType::I32, DType::I64});
  auto name = std::string(ir::op_name(op));
  for (DType t : types) {
    bool is_int = !ir::is_float(t);
    // Products stay within f16's range and integer products within 2^31 by reducing few, small factors.
    Gen gen = prod ? (is_int ? ints_in(-2, 2) : uniform(0.85, 1.15)) : is_int ? ints_in(-100, 100) : uniform(-2, 2);
    std::vector<std::pair<Ints, bool>> cases = {{{0}, false}, {{1}, true}, {{2}, false}, {{-1}, true}};
    if (!(prod && is_int))
      cases.insert(cases.end(), {{{0, 2}, false}, {{0, 1, 2}, false}, {{0, 1, 2}, true}, {{}, false}});
    for (const auto& [axes, keep] : cases) {
      V v(name + " " + dt(t) + " [3,4,5] axes " + str(axes) + (keep ? " keepdims" : ""));
      r.push_back(v.out({v.g().reduce(op, v.in("x", t, {3, 4, 5}, gen), axes, keep)}));
    }
    V v(name + " " + dt(t) + " rank 1 to rank 0");
    r.push_back(v.out({v.g().reduce(op, v.in("x", t, {7}, gen), {0})}));
    if (!is_int) {
      // Reducing nothing gives the identity element (0, 1, -inf, +inf; a mean of nothing is NaN).
      V e(name + " " + dt(t) + " over a zero-size axis");
      auto x = e.in("x", t, {0, 4}, gen);
      r.push_back(e.out({e.g().reduce(op, x, {0}), e.g().reduce(op, x, {1}, true)}));
    }
    if (!is_int && (op == OpKind::ReduceMax || op == OpKind::ReduceMin)) {
      V n(name + " " + dt(t) + " NaN propagates");
      r.push_back(n.out({n.g().reduce(op, n.in("x", t, {6, 5}, with_nans()), {1})}));
    }
  }
  if (!prod) {
    for (std::int64_t axis : {0, 1}) {
      // Sums of 257 terms: the backend may add in another order than the reference.
      V v(name + " f32 " + str(kLarge) + " axis " + std::to_string(axis));
      r.push_back(v.tol({1e-4, 1e-3}).out({v.g().reduce(op, v.in("x", DType::F32, kLarge), {axis})}));
    }
  }
  for (auto& v : wide_int_reduce_variants(op)) r.push_back(std::move(v));
  return r;
}

Variants argreduce_variants(OpKind op) {
  Variants r;
  auto name = std::string(ir::op_name(op));
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64}) {
    // Few distinct values: ties, where the first extreme must win.
    Gen gen = ir::is_float(t) ? one_of({-1, -0.5, 0, 0.25, 1, 2}) : ints_in(-3, 3);
    for (std::int64_t axis : {0, 1, 2, -1})
      for (bool keep : {false, true}) {
        V v(name + " " + dt(t) + " axis " + std::to_string(axis) + (keep ? " keepdims" : ""));
        auto x = v.in("x", t, {3, 4, 5}, gen);
        r.push_back(v.out({op == OpKind::ArgMax ? v.g().argmax(x, axis, keep) : v.g().argmin(x, axis, keep)}));
      }
    V v(name + " " + dt(t) + " continuous rank 1");
    auto x = v.in("x", t, {33}, ir::is_float(t) ? uniform() : ints_in(-1000, 1000));
    r.push_back(v.out({op == OpKind::ArgMax ? v.g().argmax(x, 0) : v.g().argmin(x, 0)}));
  }
  // The first NaN counts as the extreme, as in NumPy.
  V nan(name + " f32 NaN wins");
  auto xn = nan.in("x", DType::F32, {6, 5}, with_nans());
  r.push_back(nan.out({op == OpKind::ArgMax ? nan.g().argmax(xn, 1) : nan.g().argmin(xn, 1)}));
  V v(name + " f32 " + str(kLarge));
  auto x = v.in("x", DType::F32, kLarge);
  r.push_back(v.out({op == OpKind::ArgMax ? v.g().argmax(x, 1) : v.g().argmin(x, 0)}));
  return r;
}

Variants matmul_variants() {
  Variants r;
  const std::vector<ShapePair> shapes = {
      {{3, 4}, {4, 5}},    {{1, 4}, {4, 1}}, {{2, 3, 4}, {4, 5}}, {{2, 3, 4}, {2, 4, 5}}, {{2, 1, 3, 4}, {5, 4, 2}},
      {{3, 4}, {2, 4, 5}}, {{3, 1}, {1, 6}}, {{3, 0}, {0, 5}},    {{0, 4}, {4, 5}},       {{2, 17, 9}, {9, 33}}};
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64}) {
    Gen gen = ir::is_float(t) ? uniform(-1, 1) : ints_in(-5, 5);
    for (const auto& [a, b] : shapes) {
      V v("matmul " + dt(t) + str(a) + " x " + str(b));
      r.push_back(v.out({v.g().matmul(v.in("a", t, a, gen), v.in("b", t, b, gen))}));
    }
  }
  // The BLAS path, K = 96 terms per dot product.
  V v("matmul f32 [64,96] x [96,80]");
  r.push_back(
      v.tol({2e-4, 2e-4}).out({v.g().matmul(v.in("a", DType::F32, {64, 96}), v.in("b", DType::F32, {96, 80}))}));
  V t("matmul f32 transposed operand");
  auto a = t.in("a", DType::F32, {5, 3});
  r.push_back(t.out({t.g().matmul(t.g().transpose(a), t.in("b", DType::F32, {5, 4}))}));
  return r;
}

// ---- movement ----------------------------------------------------------------

// One dtype per element size (1, 2, 4, 8 bytes).
constexpr DType kMoveTypes[] = {DType::Bool, DType::F16, DType::F32, DType::I64};

Variants reshape_variants() {
  Variants r;
  for (DType t : kMoveTypes) {
    for (const auto& [from, to] : std::vector<ShapePair>{{{2, 3, 4}, {6, 4}},
                                                         {{2, 3, 4}, {24}},
                                                         {{2, 3, 4}, {4, 1, 6}},
                                                         {{}, {1, 1}},
                                                         {{1}, {}},
                                                         {{0, 3}, {3, 0}}}) {
      V v("reshape " + dt(t) + str(from) + " -> " + str(to));
      r.push_back(v.out({v.g().reshape(v.in("x", t, from), Shape(to))}));
    }
    // A reshape of a non-contiguous value must copy, not alias.
    V v("reshape of a permuted " + dt(t));
    r.push_back(v.out({v.g().reshape(v.g().permute(v.in("x", t, {2, 3, 4}), {2, 0, 1}), Ints{4, 6})}));
  }
  V v("reshape of a slice, then arithmetic");
  auto x = v.in("x", DType::F32, {4, 6});
  auto s = v.g().reshape(v.g().slice(x, {0}, {1}, {3}), Ints{3, 4});
  r.push_back(v.out({s, v.g().add(s, v.g().scalar(1))}));
  return r;
}

Variants permute_variants() {
  Variants r;
  for (DType t : kMoveTypes)
    for (const auto& [s, perm] : std::vector<std::pair<Ints, Ints>>{{{2, 3, 4}, {2, 0, 1}},
                                                                    {{2, 3, 4}, {0, 2, 1}},
                                                                    {{2, 3, 4}, {1, 0, 2}},
                                                                    {{2, 3, 4}, {0, 1, 2}},
                                                                    {{2, 3, 4, 5}, {3, 1, 0, 2}},
                                                                    {{1, 5, 1}, {2, 1, 0}},
                                                                    {{0, 3}, {1, 0}},
                                                                    {{5}, {0}}}) {
      V v("permute " + dt(t) + str(s) + " by " + str(perm));
      r.push_back(v.out({v.g().permute(v.in("x", t, s), perm)}));
    }
  V v("permute f32 [67,129] by [1,0]");
  r.push_back(v.out({v.g().permute(v.in("x", DType::F32, {67, 129}), {1, 0})}));
  return r;
}

Variants expand_variants() {
  Variants r;
  for (DType t : kMoveTypes)
    for (const auto& [from, to] : std::vector<ShapePair>{{{3, 1}, {3, 4}},
                                                         {{1}, {2, 3}},
                                                         {{}, {2, 2}},
                                                         {{2, 1, 3}, {4, 2, 5, 3}},
                                                         {{1, 3}, {0, 3}},
                                                         {{2, 3}, {2, 3}}}) {
      V v("expand " + dt(t) + str(from) + " -> " + str(to));
      r.push_back(v.out({v.g().expand(v.in("x", t, from), Shape(to))}));
    }
  return r;
}

Variants slice_variants() {
  Variants r;
  struct S {
    Ints shape, axes, starts, ends, steps;
  };
  const std::vector<S> cases = {{{6, 7}, {1}, {1}, {6}, {2}},
                                {{6, 7}, {0}, {-3}, {100}, {1}},
                                {{6, 7}, {0, 1}, {1, 0}, {5, 7}, {3, 3}},
                                {{6, 7}, {1}, {2}, {2}, {1}},
                                {{2, 5, 4}, {1, 2}, {1, 1}, {4, 3}, {2, 1}},
                                {{9}, {0}, {0}, {9}, {4}},
                                {{3, 4}, {-1}, {-2}, {4}, {1}}};
  for (DType t : kMoveTypes)
    for (const auto& c : cases) {
      V v("slice " + dt(t) + str(c.shape) + " axes " + str(c.axes) + " " + str(c.starts) + ":" + str(c.ends) + ":" +
          str(c.steps));
      r.push_back(v.out({v.g().slice(v.in("x", t, c.shape), c.axes, c.starts, c.ends, c.steps)}));
    }
  return r;
}

Variants concat_variants() {
  Variants r;
  for (DType t : kMoveTypes) {
    for (std::int64_t axis : {0, 1, -1}) {
      V v("concat " + dt(t) + " axis " + std::to_string(axis));
      Ints sa = {2, 3, 4}, sb = sa;
      sb[std::size_t(axis < 0 ? axis + 3 : axis)] = 5;
      auto a = v.in("a", t, sa);
      r.push_back(v.out({v.g().concat({a, v.in("b", t, sb), a}, axis)}));
    }
    V v("concat " + dt(t) + " with a zero-size piece");
    r.push_back(v.out({v.g().concat({v.in("a", t, {2, 3}), v.in("b", t, {0, 3}), v.in("c", t, {1, 3})}, 0)}));
  }
  V v("concat f32 rank 1, single input");
  r.push_back(v.out({v.g().concat({v.in("a", DType::F32, {5})}, 0)}));
  return r;
}

Variants pad_variants() {
  Variants r;
  for (DType t : kMoveTypes)
    for (const auto& [s, pads] : std::vector<std::pair<Ints, Ints>>{{{3, 4}, {1, 0, 2, 1}},
                                                                    {{3, 4}, {-1, 0, 0, -2}},
                                                                    {{3, 4}, {0, 2, -1, 1}},
                                                                    {{2, 3, 4}, {0, 1, 1, 2, 0, 1}},
                                                                    {{5}, {3, 2}},
                                                                    {{0, 2}, {1, 1, 0, 0}}}) {
      V v("pad " + dt(t) + str(s) + " by " + str(pads));
      double value = t == DType::Bool ? 1 : t == DType::I64 ? 7 : -1.5;
      r.push_back(v.out({v.g().pad(v.in("x", t, s), pads, value)}));
    }
  return r;
}

Variants gather_variants() {
  Variants r;
  for (DType t : {DType::F32, DType::F16, DType::I64, DType::Bool})
    for (DType it : {DType::I32, DType::I64}) {
      V v("gather " + dt(t) + " axis 0, " + dt(it) + " indices");
      r.push_back(v.out({v.g().gather(v.in("x", t, {4, 5}), v.in("i", it, {3, 5}, ints_in(0, 3)), 0)}));
      V w("gather " + dt(t) + " axis 1, " + dt(it) + " indices");
      r.push_back(w.out({w.g().gather(w.in("x", t, {4, 5}), w.in("i", it, {2, 7}, ints_in(0, 4)), 1)}));
    }
  V v("gather f32 rank 3 axis -1");
  r.push_back(
      v.out({v.g().gather(v.in("x", DType::F32, {2, 3, 4}), v.in("i", DType::I64, {2, 2, 6}, ints_in(0, 3)), -1)}));
  V z("gather f32 zero-size indices");
  r.push_back(z.out({z.g().gather(z.in("x", DType::F32, {2, 3}), z.in("i", DType::I64, {0, 3}, ints_in(0, 1)), 0)}));
  return r;
}

// start runs past both ends, so the clamp (XLA's) is exercised too.
Variants dynamic_update_slice_variants() {
  Variants r;
  for (DType t : {DType::F32, DType::F16, DType::F64, DType::I64, DType::Bool})
    for (DType it : {DType::I32, DType::I64}) {
      V v("dynamic_update_slice " + dt(t) + " axis 0, " + dt(it) + " start");
      r.push_back(v.out({v.g().dynamic_update_slice(v.in("x", t, {6, 3}), v.in("u", t, {2, 3}),
                                                    v.in("s", it, {}, ints_in(-2, 7)), 0)}));
    }
  V w("dynamic_update_slice f32 [3, 9, 4] axis 1 (a KV cache), [1] start");
  r.push_back(w.out({w.g().dynamic_update_slice(w.in("x", DType::F32, {3, 9, 4}), w.in("u", DType::F32, {3, 2, 4}),
                                                w.in("s", DType::I32, {1}, ints_in(-1, 9)), 1)}));
  V e("dynamic_update_slice f32 whole extent, last axis");
  r.push_back(e.out({e.g().dynamic_update_slice(e.in("x", DType::F32, {2, 5}), e.in("u", DType::F32, {2, 5}),
                                                e.in("s", DType::I64, {}, ints_in(0, 3)), -1)}));
  V z("dynamic_update_slice f32 empty update");
  r.push_back(z.out({z.g().dynamic_update_slice(z.in("x", DType::F32, {4, 2}), z.in("u", DType::F32, {0, 2}),
                                                z.in("s", DType::I64, {}, ints_in(0, 3)), 0)}));
  return r;
}

Variants index_select_variants() {
  Variants r;
  for (DType t : {DType::F32, DType::F16, DType::I64, DType::Bool})
    for (DType it : {DType::I32, DType::I64}) {
      V v("index_select " + dt(t) + " axis 0, " + dt(it) + " [6] indices");
      r.push_back(v.out({v.g().index_select(v.in("x", t, {5, 3}), v.in("i", it, {6}, ints_in(0, 4)), 0)}));
      V w("index_select " + dt(t) + " axis 1, " + dt(it) + " [2,2] indices");
      r.push_back(w.out({w.g().index_select(w.in("x", t, {5, 3}), w.in("i", it, {2, 2}, ints_in(0, 2)), 1)}));
    }
  V v("index_select f32 rank 0 index");
  r.push_back(v.out({v.g().index_select(v.in("x", DType::F32, {5, 3}), v.in("i", DType::I64, {}, ints_in(0, 4)), 0)}));
  V z("index_select f32 zero-size index");
  r.push_back(z.out({z.g().index_select(z.in("x", DType::F32, {5, 3}), z.in("i", DType::I64, {0}, ints_in(0, 4)), 0)}));
  return r;
}

Variants scatter_add_variants() {
  Variants r;
  for (DType t : {DType::F32, DType::F64, DType::I32, DType::F16}) {
    for (DType it : {DType::I32, DType::I64}) {
      // Few rows and many updates: duplicate indices must accumulate.
      V v("scatter_add " + dt(t) + " axis 0, " + dt(it) + " indices");
      auto x = v.in("x", t, {5, 3});
      r.push_back(v.out({v.g().scatter_add(x, v.in("i", it, {8, 3}, ints_in(0, 4)), v.in("u", t, {8, 3}), 0)}));
    }
    V w("scatter_add " + dt(t) + " axis 1, updates narrower than x");
    auto x = w.in("x", t, {4, 3});
    r.push_back(w.out({w.g().scatter_add(x, w.in("i", DType::I64, {2, 5}, ints_in(0, 2)), w.in("u", t, {2, 5}), 1)}));
  }
  return r;
}

Variants squeeze_variants() {
  Variants r;
  for (DType t : kMoveTypes)
    for (const auto& [s, axes] : std::vector<std::pair<Ints, Ints>>{
             {{1, 3, 1}, {0}}, {{1, 3, 1}, {0, 2}}, {{1, 3, 1}, {-1}}, {{1}, {0}}, {{2, 1, 0}, {1}}}) {
      V v("squeeze " + dt(t) + str(s) + " axes " + str(axes));
      r.push_back(v.out({v.g().squeeze(v.in("x", t, s), axes)}));
    }
  return r;
}

Variants unsqueeze_variants() {
  Variants r;
  for (DType t : kMoveTypes)
    for (const auto& [s, axes] : std::vector<std::pair<Ints, Ints>>{
             {{3}, {0}}, {{3}, {1}}, {{3}, {0, 2}}, {{}, {0}}, {{2, 3}, {-1}}, {{0, 2}, {1}}}) {
      V v("unsqueeze " + dt(t) + str(s) + " axes " + str(axes));
      r.push_back(v.out({v.g().unsqueeze(v.in("x", t, s), axes)}));
    }
  return r;
}

Variants flip_variants() {
  Variants r;
  for (DType t : kMoveTypes)
    for (const auto& [s, axes] : std::vector<std::pair<Ints, Ints>>{{{3, 4}, {0}},
                                                                    {{3, 4}, {1}},
                                                                    {{3, 4}, {0, 1}},
                                                                    {{2, 3, 4}, {1}},
                                                                    {{7}, {0}},
                                                                    {{0, 2}, {0}},
                                                                    {{3, 4}, {}}}) {
      V v("flip " + dt(t) + str(s) + " axes " + str(axes));
      r.push_back(v.out({v.g().flip(v.in("x", t, s), axes)}));
    }
  return r;
}

// ---- composites --------------------------------------------------------------

Variants linear_variants() {
  Variants r;
  for (DType t : kFloats)
    for (const Ints& xs : {Ints{3, 5}, Ints{2, 3, 5}, Ints{5}, Ints{0, 5}})
      for (bool bias : {true, false}) {
        V v("linear " + dt(t) + str(xs) + (bias ? " with bias" : ""));
        auto x = v.in("x", t, xs, uniform(-1, 1));
        auto w = v.in("w", t, {5, 4}, uniform(-1, 1));
        r.push_back(v.out({v.g().linear(x, w, bias ? std::optional(v.in("b", t, {4})) : std::nullopt)}));
      }
  return r;
}

Variants softmax_variants(OpKind op) {
  Variants r;
  auto name = std::string(ir::op_name(op));
  for (DType t : kFloats)
    for (const auto& [s, axis] : std::vector<std::pair<Ints, std::int64_t>>{
             {{3, 7}, -1}, {{3, 7}, 0}, {{2, 3, 4}, 1}, {{1}, 0}, {{2, 1, 5}, 1}, {{1, 300}, -1}}) {
      // Wide logits: the max subtraction must keep exp from overflowing.
      V v(name + " " + dt(t) + str(s) + " axis " + std::to_string(axis));
      auto x = v.in("x", t, s, uniform(-10, 10));
      r.push_back(v.out({op == OpKind::Softmax ? v.g().softmax(x, axis) : v.g().log_softmax(x, axis)}));
    }
  return r;
}

Variants layer_norm_variants() {
  Variants r;
  for (DType t : kFloats) {
    struct C {
      Ints shape;
      std::int64_t axis;
      int affine;  // 0 none, 1 gamma, 2 gamma and beta
      double eps;
    };
    for (const auto& c : std::vector<C>{{{3, 8}, -1, 2, 1e-5},
                                        {{3, 8}, -1, 0, 1e-5},
                                        {{3, 8}, 1, 1, 1e-3},
                                        {{2, 3, 4}, 1, 2, 1e-5},
                                        {{2, 3, 4}, 0, 0, 1e-5},
                                        {{4, 1}, -1, 2, 1e-2}}) {
      V v("layer_norm " + dt(t) + str(c.shape) + " axis " + std::to_string(c.axis) + " affine " +
          std::to_string(c.affine));
      auto x = v.in("x", t, c.shape, uniform(-3, 3));
      Ints norm(c.shape.begin() + (c.axis < 0 ? c.axis + std::int64_t(c.shape.size()) : c.axis), c.shape.end());
      std::optional<NodeId> gamma, beta;
      if (c.affine >= 1) gamma = v.in("gamma", t, norm);
      if (c.affine >= 2) beta = v.in("beta", t, norm);
      r.push_back(v.out({v.g().layer_norm(x, gamma, beta, c.eps, c.axis)}));
    }
  }
  return r;
}

Variants rms_norm_variants() {
  Variants r;
  for (DType t : kFloats)
    for (const Ints& s : {Ints{3, 8}, Ints{2, 3, 16}, Ints{5}})
      for (bool gamma : {true, false}) {
        V v("rms_norm " + dt(t) + str(s) + (gamma ? " with gamma" : ""));
        auto x = v.in("x", t, s, uniform(-3, 3));
        r.push_back(v.out({v.g().rms_norm(x, gamma ? std::optional(v.in("g", t, {s.back()})) : std::nullopt, 1e-5)}));
      }
  return r;
}

Variants group_norm_variants() {
  Variants r;
  struct C {
    Ints shape;
    std::int64_t groups;
  };
  for (DType t : kFloats)
    for (const C& c : {C{{2, 6, 5}, 3}, C{{3, 8, 4, 4}, 2}, C{{1, 4}, 4}, C{{2, 6, 3}, 1}, C{{0, 4, 3}, 2}})
      for (int affine = 0; affine < 3; ++affine) {  // none, gamma, gamma and beta
        V v("group_norm " + dt(t) + str(c.shape) + " groups " + std::to_string(c.groups) + " affine " +
            std::to_string(affine));
        auto x = v.in("x", t, c.shape, uniform(-3, 3));
        std::optional<ir::NodeId> gamma, beta;
        if (affine >= 1) gamma = v.in("g", t, {c.shape[1]});
        if (affine >= 2) beta = v.in("b", t, {c.shape[1]});
        r.push_back(v.out({v.g().group_norm(x, c.groups, gamma, beta)}));
      }
  V v("group_norm eps 0.1");
  r.push_back(v.out({v.g().group_norm(v.in("x", DType::F32, {2, 4, 3}), 2, std::nullopt, std::nullopt, 0.1)}));
  return r;
}

Variants conv1d_variants() {
  Variants r;
  struct C {
    Ints x, w;
    std::int64_t stride, padding, dilation, groups;
    bool bias;
  };
  for (DType t : kFloats)
    for (const auto& c : std::vector<C>{{{2, 4, 9}, {6, 4, 3}, 1, 0, 1, 1, true},
                                        {{2, 4, 9}, {6, 4, 3}, 2, 1, 1, 1, false},
                                        {{2, 4, 9}, {6, 4, 3}, 1, 2, 2, 1, true},
                                        {{2, 4, 9}, {6, 2, 3}, 1, 1, 1, 2, true},
                                        {{1, 4, 8}, {4, 1, 5}, 3, 2, 1, 4, false},
                                        {{1, 3, 5}, {2, 3, 1}, 1, 0, 1, 1, true}}) {
      V v("conv1d " + dt(t) + " x" + str(c.x) + " w" + str(c.w) + " stride " + std::to_string(c.stride) + " pad " +
          std::to_string(c.padding) + " dil " + std::to_string(c.dilation) + " groups " + std::to_string(c.groups));
      auto x = v.in("x", t, c.x, uniform(-1, 1));
      auto w = v.in("w", t, c.w, uniform(-1, 1));
      auto b = c.bias ? std::optional(v.in("b", t, {c.w[0]})) : std::nullopt;
      r.push_back(v.out({v.g().conv1d(x, w, b, c.stride, c.padding, c.dilation, c.groups)}));
    }
  return r;
}

Variants conv2d_variants() {
  Variants r;
  struct C {
    Ints x, w, stride, padding, dilation;
    std::int64_t groups;
    bool bias;
  };
  for (DType t : kFloats)
    for (const auto& c : std::vector<C>{{{2, 4, 7, 8}, {6, 4, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1, true},
                                        {{2, 4, 7, 8}, {6, 4, 3, 3}, {2, 1}, {1, 2}, {1, 1}, 1, false},
                                        {{1, 4, 9, 9}, {5, 4, 3, 2}, {1, 2}, {2, 1}, {2, 1}, 1, true},
                                        {{2, 4, 6, 6}, {6, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 2, true},
                                        {{1, 3, 5, 5}, {3, 1, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 3, false},
                                        {{2, 3, 4, 5}, {8, 3, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1, true},
                                        // Whole blocks of 16 channels: the CPU's direct kernel.
                                        {{2, 16, 7, 9}, {32, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true},
                                        {{1, 32, 9, 8}, {32, 16, 3, 3}, {2, 2}, {2, 1}, {2, 1}, 2, false},
                                        {{1, 16, 5, 6}, {16, 16, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1, true}}) {
      V v("conv2d " + dt(t) + " x" + str(c.x) + " w" + str(c.w) + " stride " + str(c.stride) + " pad " +
          str(c.padding) + " dil " + str(c.dilation) + " groups " + std::to_string(c.groups));
      auto x = v.in("x", t, c.x, uniform(-1, 1));
      auto w = v.in("w", t, c.w, uniform(-1, 1));
      auto b = c.bias ? std::optional(v.in("b", t, {c.w[0]})) : std::nullopt;
      r.push_back(v.out({v.g().conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups)}));
    }
  return r;
}

Variants pool_variants(OpKind op) {
  Variants r;
  auto name = std::string(ir::op_name(op));
  for (DType t : kFloats)
    for (const auto& [k, s, p] : std::vector<std::tuple<Ints, Ints, Ints>>{
             {{2, 2}, {2, 2}, {0, 0}}, {{3, 3}, {1, 2}, {1, 1}}, {{3, 2}, {2, 3}, {1, 0}}, {{1, 1}, {1, 1}, {0, 0}}}) {
      V v(name + " " + dt(t) + " kernel " + str(k) + " stride " + str(s) + " pad " + str(p));
      auto x = v.in("x", t, {2, 3, 7, 8});
      r.push_back(v.out({op == OpKind::MaxPool2d ? v.g().max_pool2d(x, k, s, p) : v.g().avg_pool2d(x, k, s, p)}));
    }
  return r;
}

Variants embedding_variants() {
  Variants r;
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F64})
    for (DType it : {DType::I32, DType::I64})
      for (const Ints& ids : {Ints{4}, Ints{2, 3}, Ints{}}) {
        V v("embedding " + dt(t) + " table, " + dt(it) + str(ids) + " ids");
        r.push_back(v.out({v.g().embedding(v.in("table", t, {10, 6}), v.in("ids", it, ids, ints_in(0, 9)))}));
      }
  // A block-quantized table (a model's token embedding): the rows come out dequantized, as f32.
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
    V v("embedding " + dt(t) + " block table, i32[2, 3] ids");
    v.v.gens["table"] = quantized();
    auto table = v.g().param("table", Shape{10, two_blocks(t)}, t);
    r.push_back(v.out({v.g().embedding(table, v.in("ids", DType::I32, {2, 3}, ints_in(-10, 9)))}));
  }
  return r;
}

// A boolean attention mask with key 0 always visible, so no row is fully
// masked (that row is 0/0 by definition).
Gen attention_mask() {
  return [](DType t, const Ints& s, std::mt19937_64& rng) {
    auto m = bools(0.6)(t, s, rng);
    for (std::int64_t i = 0; i < m.numel(); i += s.back()) m.set(i, 1);
    return m;
  };
}

// A KV cache's mask: each row keeps keys 0..p for its own random p, and nothing after (the CPU kernel stops at
// the last kept key of a block of rows).
Gen prefix_mask() {
  return [](DType t, const Ints& s, std::mt19937_64& rng) {
    ir::Tensor m(t, s);
    const std::int64_t cols = s.back();
    std::uniform_int_distribution<std::int64_t> last(0, cols - 1);
    for (std::int64_t row = 0; row < m.numel() / cols; ++row) {
      const std::int64_t p = last(rng);
      for (std::int64_t j = 0; j < cols; ++j) m.set(row * cols + j, j <= p ? 1 : 0);
    }
    return m;
  };
}

// Custom ops: one through its lowering (inlined, fused with its neighbours),
// one through a host kernel.
Variants custom_variants() {
  rlx::testing::register_test_ops();
  Variants r;
  for (DType t : kFloats) {
    V v("custom test_scaled_silu (lowered, fused) " + dt(t));
    auto x = v.in("x", t, {5, 33}, uniform(-3, 3));
    auto one = v.g().scalar(1.0, t);
    r.push_back(v.out({v.g().mul(v.g().custom_op("test_scaled_silu", {{"alpha", 1.5}}, {v.g().add(x, one)}), x)}));
  }
  V v("custom test_host_cube (host kernel) f32");
  auto x = v.in("x", DType::F32, {4, 7}, uniform(-2, 2));
  r.push_back(v.out({v.g().relu(v.g().custom_op("test_host_cube", {}, {v.g().add(x, x)}))}));
  return r;
}

Variants attention_variants() {
  Variants r;
  struct C {
    Ints q, k, v;
    int mask;  // 0 none, 1 bool, 2 float, 3 bool keeping a prefix of each row
    Ints mask_shape;
    bool causal;
    double scale;
  };
  for (DType t : kFloats)
    for (const auto& c : std::vector<C>{{{2, 3, 4, 8}, {2, 3, 4, 8}, {2, 3, 4, 8}, 0, {}, false, 0.0},
                                        {{2, 3, 4, 8}, {2, 3, 4, 8}, {2, 3, 4, 8}, 0, {}, true, 0.0},
                                        {{1, 2, 5, 8}, {1, 2, 5, 8}, {1, 2, 5, 8}, 0, {}, false, 0.5},
                                        {{2, 2, 4, 8}, {2, 2, 6, 8}, {2, 2, 6, 8}, 1, {2, 1, 4, 6}, false, 0.0},
                                        {{2, 2, 4, 8}, {2, 2, 6, 8}, {2, 2, 6, 8}, 2, {1, 1, 4, 6}, false, 0.0},
                                        {{1, 2, 3, 8}, {1, 2, 5, 8}, {1, 2, 5, 6}, 0, {}, true, 0.0},
                                        {{1, 1, 4, 4}, {1, 1, 4, 4}, {1, 1, 4, 4}, 1, {4, 4}, true, 0.25},
                                        {{1, 2, 1, 16}, {1, 2, 7, 16}, {1, 2, 7, 16}, 2, {1, 2, 1, 7}, false, 0.0},
                                        {{1, 2, 4, 8}, {1, 2, 12, 8}, {1, 2, 12, 8}, 3, {1, 1, 4, 12}, false, 0.0},
                                        // grouped KV heads (GQA), and one KV head for all (MQA)
                                        {{1, 4, 3, 8}, {1, 2, 5, 8}, {1, 2, 5, 8}, 0, {}, false, 0.0},
                                        {{2, 6, 2, 8}, {2, 2, 9, 8}, {2, 2, 9, 8}, 3, {2, 1, 2, 9}, false, 0.0},
                                        {{1, 4, 3, 8}, {1, 2, 3, 8}, {1, 2, 3, 8}, 0, {}, true, 0.0},
                                        {{1, 4, 1, 16}, {1, 1, 7, 16}, {1, 1, 7, 16}, 3, {1, 1, 1, 7}, false, 0.0}}) {
      V v("attention " + dt(t) + " q" + str(c.q) + " k" + str(c.k) + " v" + str(c.v) +
          (c.mask == 1   ? " bool mask "
           : c.mask == 2 ? " float mask "
           : c.mask == 3 ? " prefix mask "
                         : "") +
          (c.mask ? str(c.mask_shape) : "") + (c.causal ? " causal" : "") +
          (c.scale != 0 ? " scale " + std::to_string(c.scale) : ""));
      auto q = v.in("q", t, c.q, uniform(-1, 1));
      auto k = v.in("k", t, c.k, uniform(-1, 1));
      auto val = v.in("v", t, c.v, uniform(-1, 1));
      std::optional<NodeId> mask;
      if (c.mask == 1) mask = v.in("mask", DType::Bool, c.mask_shape, attention_mask());
      if (c.mask == 2) mask = v.in("mask", t, c.mask_shape, uniform(-2, 0));
      if (c.mask == 3) mask = v.in("mask", DType::Bool, c.mask_shape, prefix_mask());
      r.push_back(v.out({v.g().attention(q, k, val, mask, c.causal, c.scale)}));
    }
  return r;
}

// x [.., D] with cos and sin broadcast from [T, 1, D/2] (the LLM's tables), a full [.., D/2], a scalar row, and
// both pairings.
Variants rope_variants() {
  Variants r;
  struct C {
    Ints x, cs;
    bool interleaved;
  };
  for (DType t : kFloats)
    for (const auto& c : std::vector<C>{{{5, 3, 8}, {5, 1, 4}, true},
                                        {{5, 3, 8}, {5, 1, 4}, false},
                                        {{2, 3, 4, 6}, {2, 3, 4, 3}, true},
                                        {{4, 2}, {1}, false},
                                        {{3, 2, 16}, {8}, true}}) {
      V v("rope " + dt(t) + " x" + str(c.x) + " cos/sin" + str(c.cs) + (c.interleaved ? " interleaved" : " halves"));
      auto x = v.in("x", t, c.x, uniform(-2, 2));
      auto cos = v.in("cos", t, c.cs, uniform(-1, 1));
      auto sin = v.in("sin", t, c.cs, uniform(-1, 1));
      r.push_back(v.out({v.g().rope(x, cos, sin, c.interleaved)}));
    }
  return r;
}

// ---- control flow --------------------------------------------------------------
// Short scans are unrolled into ordinary kernels; long ones, ifs with a
// run-time condition and whiles run as the backend's host loop.

// (h, x, w) -> (tanh(h w + x), h * x): a recurrent cell with a matmul.
ir::GraphRef rnn_cell(DType t, std::int64_t d) {
  Graph b("cell");
  NodeId h = b.input("h", Shape{2, d}, t), x = b.input("x", Shape{2, d}, t), w = b.input("w", Shape{d, d}, t);
  b.set_outputs({b.unary(OpKind::Tanh, b.add(b.matmul(h, w), x)), b.mul(h, x)});
  return ir::body_ref(std::move(b));
}

Variants scan_variants() {
  Variants r;
  for (DType t : kFloats)
    for (std::int64_t length : {6, 1200}) {  // unrolled; a host loop (1200 x body nodes > 4096)
      if (length > 64 && (t == DType::F16 || t == DType::BF16)) continue;  // rounding compounds over 1200 steps
      for (bool reverse : {false, true}) {
        V v("scan " + dt(t) + " length " + std::to_string(length) + (reverse ? " reverse" : ""));
        auto res = ir::scan(v.g(), rnn_cell(t, 4), {v.in("h0", t, {2, 4})}, {v.in("xs", t, {length, 2, 4})}, length,
                            reverse, {v.in("w", t, {4, 4}, uniform(-0.5, 0.5))});
        r.push_back(v.out(res));
      }
    }
  // An i32 step counter, a carry passed through, ys only, and an empty scan.
  for (std::int64_t length : {0, 5, 2000}) {
    Graph b("count");
    NodeId n = b.input("n", Shape{}, DType::I32), keep = b.input("keep", Shape{3}, DType::U8);
    NodeId x = b.input("x", Shape{3}, DType::F32);
    NodeId n2 = b.add(n, b.scalar(1, DType::I32));
    b.set_outputs({n2, keep, b.mul(x, b.cast(n2, DType::F32))});
    V v("scan counter, passthrough, ys only, length " + std::to_string(length));
    auto res = ir::scan(v.g(), ir::body_ref(std::move(b)),
                        {v.g().scalar(0, DType::I32), v.in("keep", DType::U8, {3}, ints_in(0, 255))},
                        {v.in("xs", DType::F32, {length, 3})});
    r.push_back(v.out({res[0], res[1], res[2]}));
    V ys_only("scan ys only, length " + std::to_string(length));
    Graph b2("count");
    NodeId n_ = b2.input("n", Shape{}, DType::I32), x_ = b2.input("x", Shape{3}, DType::F32);
    b2.set_outputs({b2.add(n_, b2.scalar(1, DType::I32)), b2.mul(x_, b2.cast(n_, DType::F32))});
    r.push_back(ys_only.out({ir::scan(ys_only.g(), ir::body_ref(std::move(b2)), {ys_only.g().scalar(0, DType::I32)},
                                      {ys_only.in("xs", DType::F32, {length, 3})})[1]}));
  }
  return r;
}

Variants if_variants() {
  Variants r;
  for (DType t : kFloats) {
    Graph then_b("then"), else_b("else");
    NodeId a = then_b.input("a", Shape{3, 4}, t), b = then_b.input("b", Shape{4}, t);
    then_b.set_outputs({then_b.add(then_b.unary(OpKind::Exp, a), b), then_b.sum(a, {1})});
    NodeId a2 = else_b.input("a", Shape{3, 4}, t);
    else_b.input("b", Shape{4}, t);
    else_b.set_outputs({else_b.unary(OpKind::Neg, a2), else_b.reduce(OpKind::ReduceMax, a2, {1})});
    ir::GraphRef tb = ir::body_ref(std::move(then_b)), eb = ir::body_ref(std::move(else_b));
    V v("if " + dt(t) + " run-time condition (host branch)");
    auto res = ir::if_else(v.g(), v.in("p", DType::Bool, {}), tb, eb, {v.in("a", t, {3, 4}), v.in("b", t, {4})});
    r.push_back(v.out(res));
    for (bool c : {true, false}) {
      V k("if " + dt(t) + " constant " + (c ? "true" : "false") + " (resolved)");
      r.push_back(k.out(
          {ir::if_else(k.g(), k.g().scalar(c, DType::Bool), tb, eb, {k.in("a", t, {3, 4}), k.in("b", t, {4})})[1]}));
    }
  }
  return r;
}

// while (i < n): v = v * f + 1, i += 1; optionally at most 3 times.
Variants while_variants() {
  Variants r;
  for (DType t : {DType::F32, DType::F64, DType::I64})
    for (std::int64_t max_trips : {-1, 3}) {
      Graph cond("cond"), body("body");
      NodeId i = cond.input("i", Shape{}, DType::I32), n = cond.input("n", Shape{}, DType::I32);
      cond.input("v", Shape{4}, t);
      cond.add_output(cond.binary(OpKind::Lt, i, n));
      NodeId bi = body.input("i", Shape{}, DType::I32), bn = body.input("n", Shape{}, DType::I32);
      NodeId bv = body.input("v", Shape{4}, t), bf = body.input("f", Shape{4}, t);
      cond.input("f", Shape{4}, t);
      body.set_outputs({body.add(bi, body.scalar(1, DType::I32)), bn, body.add(body.mul(bv, bf), body.scalar(1, t))});
      V v("while " + dt(t) + (max_trips >= 0 ? " max_trip_count 3" : ""));
      auto res = ir::while_loop(v.g(), ir::body_ref(std::move(cond)), ir::body_ref(std::move(body)),
                                {v.g().scalar(0, DType::I32), v.in("n", DType::I32, {}, ints_in(0, 6)),
                                 v.in("v", t, {4}, ir::is_float(t) ? uniform(-1, 1) : ints_in(-3, 3))},
                                {v.in("f", t, {4}, ir::is_float(t) ? uniform(-1.2, 1.2) : ints_in(-2, 2))}, max_trips);
      r.push_back(v.out(res));
    }
  return r;
}

// The backward ops autodiff emits: (forward value, cotangent[, gamma]) -> input cotangent.
Variants softmax_backward_variants(OpKind op) {
  Variants r;
  auto name = std::string(ir::op_name(op));
  bool log = op == OpKind::LogSoftmaxBackward;
  for (DType t : kFloats)
    for (const auto& [s, axis] : std::vector<std::pair<Ints, std::int64_t>>{
             {{3, 7}, -1}, {{3, 7}, 0}, {{2, 3, 4}, 1}, {{1}, 0}, {{0, 5}, 1}, {{4, 300}, -1}, {{64, 33}, 0}}) {
      V v(name + " " + dt(t) + str(s) + " axis " + std::to_string(axis));
      auto y = v.in("y", t, s, log ? uniform(-4, 0) : uniform(0, 1));
      auto dy = v.in("dy", t, s, uniform(-1, 1));
      r.push_back(v.out({v.g().add(op, {y, dy}, {{"axis", axis}})}));
    }
  return r;
}

Variants norm_backward_variants(OpKind op) {
  Variants r;
  auto name = std::string(ir::op_name(op));
  bool rms = op == OpKind::RmsNormBackward;
  for (DType t : kFloats)
    for (const auto& [s, axis] : std::vector<std::pair<Ints, std::int64_t>>{
             {{3, 8}, -1}, {{2, 3, 4}, 1}, {{5}, 0}, {{4, 1}, -1}, {{0, 6}, -1}, {{16, 257}, -1}})
      for (bool gamma : {true, false}) {
        // rms_norm normalizes the last dim; over one element its dx is r dy eps / (x^2 + eps), a
        // cancellation no f16/bf16 decomposition resolves.
        if (rms && ((axis != -1 && axis + 1 != std::int64_t(s.size())) || s.back() == 1)) continue;
        V v(name + " " + dt(t) + str(s) + (rms ? "" : " axis " + std::to_string(axis)) + (gamma ? " with gamma" : ""));
        auto x = v.in("x", t, s, uniform(-3, 3));
        auto dy = v.in("dy", t, s, uniform(-1, 1));
        std::vector<NodeId> ins{x, dy};
        if (gamma)
          ins.push_back(v.in("gamma", t, Ints(s.begin() + (axis < 0 ? axis + std::int64_t(s.size()) : axis), s.end())));
        ir::Attrs a{{"eps", 1e-5}};
        if (!rms) a.set("axis", axis);
        r.push_back(v.out({v.g().add(op, ins, a)}));
      }
  return r;
}

// ---- the table ---------------------------------------------------------------

struct OpCase {
  OpKind op;
  std::function<Variants()> variants;
};

const std::vector<OpCase>& parity_table() {
  static const std::vector<OpCase> table = [] {
    std::vector<OpCase> t = {
        {OpKind::Input, input_variants},
        {OpKind::Param, param_variants},
        {OpKind::Constant, constant_variants},
        {OpKind::Iota, iota_variants},
        {OpKind::RandomUniform, [] { return random_variants(OpKind::RandomUniform); }},
        {OpKind::RandomNormal, [] { return random_variants(OpKind::RandomNormal); }},
        {OpKind::Not, not_variants},
        {OpKind::And, [] { return logical_variants(OpKind::And); }},
        {OpKind::Or, [] { return logical_variants(OpKind::Or); }},
        {OpKind::Where, where_variants},
        {OpKind::Cast, cast_variants},
        {OpKind::Clamp, clamp_variants},
        {OpKind::ArgMax, [] { return argreduce_variants(OpKind::ArgMax); }},
        {OpKind::ArgMin, [] { return argreduce_variants(OpKind::ArgMin); }},
        {OpKind::MatMul, matmul_variants},
        {OpKind::Reshape, reshape_variants},
        {OpKind::Permute, permute_variants},
        {OpKind::Expand, expand_variants},
        {OpKind::Slice, slice_variants},
        {OpKind::Concat, concat_variants},
        {OpKind::Pad, pad_variants},
        {OpKind::Gather, gather_variants},
        {OpKind::IndexSelect, index_select_variants},
        {OpKind::ScatterAdd, scatter_add_variants},
        {OpKind::Squeeze, squeeze_variants},
        {OpKind::Unsqueeze, unsqueeze_variants},
        {OpKind::Flip, flip_variants},
        {OpKind::Linear, linear_variants},
        {OpKind::Softmax, [] { return softmax_variants(OpKind::Softmax); }},
        {OpKind::LogSoftmax, [] { return softmax_variants(OpKind::LogSoftmax); }},
        {OpKind::LayerNorm, layer_norm_variants},
        {OpKind::RmsNorm, rms_norm_variants},
        {OpKind::GroupNorm, group_norm_variants},
        {OpKind::Conv1d, conv1d_variants},
        {OpKind::Conv2d, conv2d_variants},
        {OpKind::MaxPool2d, [] { return pool_variants(OpKind::MaxPool2d); }},
        {OpKind::AvgPool2d, [] { return pool_variants(OpKind::AvgPool2d); }},
        {OpKind::Embedding, embedding_variants},
        {OpKind::DynamicUpdateSlice, dynamic_update_slice_variants},
        {OpKind::Dequantize, dequantize_variants},
        {OpKind::Quantize, quantize_variants},
        {OpKind::QuantizedMatmul, quantized_matmul_variants},
        {OpKind::Attention, attention_variants},
        {OpKind::Rope, rope_variants},
        {OpKind::SoftmaxBackward, [] { return softmax_backward_variants(OpKind::SoftmaxBackward); }},
        {OpKind::LogSoftmaxBackward, [] { return softmax_backward_variants(OpKind::LogSoftmaxBackward); }},
        {OpKind::LayerNormBackward, [] { return norm_backward_variants(OpKind::LayerNormBackward); }},
        {OpKind::RmsNormBackward, [] { return norm_backward_variants(OpKind::RmsNormBackward); }},
        {OpKind::Custom, custom_variants},
        {OpKind::Scan, scan_variants},
        {OpKind::If, if_variants},
        {OpKind::While, while_variants},
    };
    for (OpKind op : ir::kAllOps) {
      auto cls = ir::op_info(op).cls;
      if (cls == ir::OpClass::Unary && op != OpKind::Not) t.push_back({op, [op] { return unary_variants(op); }});
      if (cls == ir::OpClass::Binary && op != OpKind::And && op != OpKind::Or)
        t.push_back({op, [op] { return ir::is_comparison(op) ? compare_variants(op) : binary_variants(op); }});
      if (cls == ir::OpClass::Reduce && op != OpKind::ArgMax && op != OpKind::ArgMin)
        t.push_back({op, [op] { return reduce_variants(op); }});
    }
    return t;
  }();
  return table;
}

// Adding an op to kAllOps without a parity case fails here; so does a case
// whose graphs never contain the op it claims to test.
TEST(OpParityTable, CoversEveryOp) {
  for (OpKind op : ir::kAllOps) {
    SCOPED_TRACE(std::string(ir::op_name(op)));
    std::size_t cases = 0, using_op = 0;
    for (const auto& c : parity_table()) {
      if (c.op != op) continue;
      ++cases;
      for (const auto& v : c.variants()) {
        EXPECT_NO_THROW(v.graph.verify()) << v.label;
        auto& nodes = v.graph.nodes();
        using_op += std::any_of(nodes.begin(), nodes.end(), [op](const ir::Node& n) { return n.op == op; });
      }
    }
    EXPECT_EQ(cases, 1u) << "every op needs exactly one parity case";
    EXPECT_GT(using_op, 0u) << "no parity graph uses the op";
  }
}

class OpParity : public ::testing::TestWithParam<std::tuple<Device, std::size_t>> {
 protected:
  void SetUp() override {
    if (auto why = unavailable_reason(std::get<0>(GetParam())); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(OpParity, MatchesReference) {
  auto [device, index] = GetParam();
  auto variants = parity_table()[index].variants();
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const Variant& v = variants[i];
    Check check;
    check.gens = v.gens;
    check.tol = v.tol;
    check.seed = testing::test_seed() + i;
    check.label = v.label;
    EXPECT_TRUE(matches_reference(device, v.graph, check));
    if (!has_hir_only(v.graph)) continue;
    // No public knob forces decomposition yet: decompose before compiling, so
    // the backend only sees primitives, and compare with the composite's reference.
    Graph decomposed;
    try {
      decomposed = compile::passes::decompose(v.graph, {});
    } catch (const std::exception& e) {
      ADD_FAILURE() << v.label << ": decompose threw: " << e.what();
      continue;
    }
    check.label += " (decomposed)";
    EXPECT_TRUE(matches_reference(device, decomposed, v.graph, check));
  }
}

std::string parity_name(const ::testing::TestParamInfo<OpParity::ParamType>& info) {
  return std::string(runtime::device_label(std::get<0>(info.param))) + "_" +
         std::string(ir::op_name(parity_table()[std::get<1>(info.param)].op));
}

INSTANTIATE_TEST_SUITE_P(Conformance, OpParity,
                         ::testing::Combine(::testing::ValuesIn(backends()),
                                            ::testing::Range(std::size_t{0}, parity_table().size())),
                         parity_name);

// ---- generated C: one more executor -------------------------------------------
// Every variant also runs through the C target (rlx::codegen::c), checked as on
// the devices: the same generators, seeds, poisoned outputs and tolerances. All
// variants of one op are emitted first and built into one shared object by one
// `cc` run, so the suite adds one compiler run per op.

// The C target has no type for f16, bf16, the 16-bit and unsigned wide integers and the storage-only types
// (include/rlx/codegen/c.hpp; its traits' native_dtypes): a variant using one must be rejected, for that reason,
// and is not run.
bool uses_half(const Graph& g) {
  const auto native = codegen::c::traits().native_dtypes;
  // (The block types are kCGaps' entries.)
  return std::any_of(g.nodes().begin(), g.nodes().end(),
                     [&](const ir::Node& n) { return !native.contains(n.dtype) && !ir::is_block_quantized(n.dtype); });
}

// What else the C target cannot emit: an op, or the variants of an op whose
// label contains `label_part`. Each must throw rlx::Error from emit; one that
// starts to emit fails, and so does a variant that throws without an entry.
struct CGap {
  OpKind op;
  std::string_view label_part;  // empty: every variant of the op
  std::string_view reason;
};
constexpr CGap kCGaps[] = {
    // Short scans and constant ifs are resolved by lower_control_flow and run as straight-line C; what
    // stays a host loop or branch (a ControlFlow kernel in the LIR) has no C code.
    {OpKind::Scan, "length 1200", "control flow: a scan too long to unroll stays a host loop over its body"},
    {OpKind::Scan, "length 2000", "control flow: a scan too long to unroll stays a host loop over its body"},
    {OpKind::If, "run-time condition", "control flow: an if on a run-time condition stays a host branch"},
    {OpKind::While, "", "control flow: a while loop stays a host loop over its body"},
    {OpKind::Custom, "host kernel", "a custom op with a host kernel and no lowering has no C code"},
    {OpKind::Dequantize, "", "block-quantized types have no C type"},
    {OpKind::Quantize, "", "block-quantized types have no C type"},
    {OpKind::QuantizedMatmul, "", "block-quantized types have no C type"},
    {OpKind::Embedding, "block table", "block-quantized types have no C type"},
};

const CGap* c_gap(OpKind op, const std::string& label) {
  for (const CGap& g : kCGaps)
    if (g.op == op && label.find(g.label_part) != std::string::npos) return &g;
  return nullptr;
}

class CCodegen : public ::testing::TestWithParam<std::size_t> {
 protected:
  void SetUp() override {
    if (!testing::have_c_compiler())
      GTEST_SKIP() << "no C compiler: '" << testing::c_compiler() << " --version' failed";
  }
};

TEST_P(CCodegen, MatchesReference) {
  const OpCase& c = parity_table()[GetParam()];
  const std::string op(ir::op_name(c.op));
  auto variants = c.variants();
  std::vector<codegen::c::Source> sources;
  std::vector<std::size_t> emitted;  // the variant of each source
  std::size_t halves = 0;
  std::set<std::string_view> gaps;  // the reasons of the variants not emitted
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const Variant& v = variants[i];
    const CGap* gap = c_gap(c.op, v.label);
    const bool half = uses_half(v.graph);
    codegen::c::Options options;
    options.function_name = op + "_" + std::to_string(i);
    try {
      sources.push_back(codegen::c::emit(v.graph, options));
    } catch (const Error& e) {
      if (half && std::string_view(e.what()).find("is not supported by the C target") != std::string_view::npos)
        ++halves;
      else if (gap && !half)
        gaps.insert(gap->reason);
      else
        ADD_FAILURE() << v.label << ": the C target throws and no entry of kCGaps says why: " << e.what();
      continue;
    } catch (const std::exception& e) {
      ADD_FAILURE() << v.label << ": emit threw a non-rlx exception: " << e.what();
      continue;
    }
    if (half || gap) {
      ADD_FAILURE() << v.label << ": the C target now emits it; "
                    << (half ? "it takes a dtype C lacked: run these variants" : "remove the kCGaps entry");
      sources.pop_back();
      continue;
    }
    emitted.push_back(i);
  }
  std::string why;
  for (auto r : gaps) why += (why.empty() ? "" : "; ") + std::string(r);
  std::fprintf(stderr, "[rlx] %s: %zu variants through C, %zu with a dtype C lacks not emitted, %zu in kCGaps%s%s\n",
               op.c_str(), emitted.size(), halves, variants.size() - emitted.size() - halves, why.empty() ? "" : ": ",
               why.c_str());
  if (!sources.empty()) {
    testing::CModule module(std::move(sources), "-O1");
    ASSERT_TRUE(module.error().empty()) << module.error();
    for (std::size_t k = 0; k < emitted.size(); ++k) {
      const Variant& v = variants[emitted[k]];
      Check check;
      check.gens = v.gens;
      check.tol = v.tol;
      check.seed = testing::test_seed() + emitted[k];
      check.label = v.label + " (generated C)";
      EXPECT_TRUE(matches_reference([&] { return c_executor(module, k); }, v.graph, v.graph, check));
    }
  }
  if (emitted.empty() && !gaps.empty() && !HasFailure()) {
    GTEST_SKIP() << "the C target cannot emit " << op << ": " << why;
  }
  EXPECT_FALSE(emitted.empty()) << "no variant of " << op << " runs through C";
}

INSTANTIATE_TEST_SUITE_P(OpParity, CCodegen, ::testing::Range(std::size_t{0}, parity_table().size()),
                         [](const auto& info) { return std::string(ir::op_name(parity_table()[info.param].op)); });

// ---- generated CUDA C: every kernel compiles with NVRTC ---------------------------
// The CUDA backend runs the C target's loop nests as CUDA C (codegen::c::emit_cuda). NVRTC needs no GPU, so
// every kernel of every variant, compiled for the CUDA backend's traits, is built here to Hopper's PTX
// (compute_90: the front end's checks at half the time of machine code); on a machine with a GPU, OpParity
// runs them. A kernel emit_cuda refuses must be one the backend runs on
// the host: control flow left as a host loop, or a native kernel.
class CudaCodegen : public ::testing::TestWithParam<std::size_t> {
 protected:
  void SetUp() override {
    if (auto why = backends::cuda::nvrtc_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(CudaCodegen, EveryKernelCompiles) {
  const OpCase& c = parity_table()[GetParam()];
  std::size_t kernels = 0, host = 0, quantized = 0;
  for (const Variant& v : c.variants()) {
    compile::CompileResult r;
    try {
      r = compile::compile(v.graph, backends::cuda::traits(), {});
    } catch (const Error& e) {
      ADD_FAILURE() << v.label << ": compiling for the CUDA backend's traits threw: " << e.what();
      continue;
    }
    const codegen::c::CudaModule module = backends::cuda::emit(r.lir);  // as the backend emits it: vector phases too
    ASSERT_EQ(module.kernels.size(), r.lir.kernels.size());
    for (std::size_t k = 0; k < r.lir.kernels.size(); ++k) {
      const auto& kernel = r.lir.kernels[k];
      const auto& code = module.kernels[k];
      if (!code.why.empty()) {
        // A dtype the CUDA C has no type for (i16, u16, u32, u64, the storage-only types) runs on the host too.
        const auto native = backends::cuda::traits().native_dtypes;
        const bool foreign = std::any_of(kernel.body.nodes().begin(), kernel.body.nodes().end(),
                                         [&](const ir::Node& n) { return !native.contains(n.dtype); });
        EXPECT_TRUE(kernel.kind == compile::KernelKind::ControlFlow || kernel.kind == compile::KernelKind::Native ||
                    foreign)
            << v.label << ": kernel '" << kernel.name << "' has no CUDA C: " << code.why;
        // The block types' ops run as the backend's quantized kernels (src/backends/cuda/quant.hpp), never on
        // the host: their programs are compiled by CudaQuant.ProgramCompilesWithNvrtc.
        const bool quant = std::any_of(kernel.body.nodes().begin(), kernel.body.nodes().end(), [](const ir::Node& n) {
          return n.op == OpKind::QuantizedMatmul || n.op == OpKind::Dequantize || n.op == OpKind::Embedding;
        });
        backends::cuda::QuantLaunch launch;
        std::string no_quant;
        if (quant) {
          EXPECT_TRUE(backends::cuda::plan_quant(r.lir, kernel, &launch, &no_quant))
              << v.label << ": kernel '" << kernel.name << "' would run on the host: " << no_quant;
        }
        // Attention runs as the backend's flash attention (src/backends/cuda/attention.hpp): planned, and compiled.
        backends::cuda::AttentionLaunch attention;
        if (std::any_of(kernel.body.nodes().begin(), kernel.body.nodes().end(),
                        [](const ir::Node& n) { return n.op == OpKind::Attention; })) {
          EXPECT_TRUE(backends::cuda::plan_attention(r.lir, kernel, {227 * 1024, 132}, &attention, &no_quant))
              << v.label << ": kernel '" << kernel.name << "' would run on the host: " << no_quant;
          if (!attention.source.empty())
            EXPECT_GT(backends::cuda::compile_for_arch(attention.source, "compute_90"), 0u);
        }
        ++(quant ? quantized : host);
        continue;
      }
      ++kernels;
      EXPECT_FALSE(code.phases.empty()) << v.label << ": kernel '" << kernel.name << "'";
      if (kernel.kind == compile::KernelKind::MatMul)  // the backend's cuBLASLt path needs one or the other
        EXPECT_TRUE(code.product_is_output || !code.epilogue.empty()) << v.label << ": kernel '" << kernel.name << "'";
    }
    try {
      EXPECT_GT(backends::cuda::compile_for_arch(module.source, "compute_90"), 0u);
    } catch (const Error& e) {
      ADD_FAILURE() << v.label << ": " << e.what();
    }
  }
  std::fprintf(stderr, "[rlx] %s: %zu kernels compiled by NVRTC, %zu quantized kernels, %zu left to the host\n",
               std::string(ir::op_name(c.op)).c_str(), kernels, quantized, host);
}

INSTANTIATE_TEST_SUITE_P(OpParity, CudaCodegen, ::testing::Range(std::size_t{0}, parity_table().size()),
                         [](const auto& info) { return std::string(ir::op_name(parity_table()[info.param].op)); });

// ---- the harness itself -------------------------------------------------------
// A backend that forwards to a real one but writes only the first half of
// each output: the poisoned outputs must make the comparison fail.
class HalfWritingExe : public runtime::ExecutableGraph {
 public:
  HalfWritingExe(std::unique_ptr<runtime::ExecutableGraph> real, std::vector<std::size_t> out_bytes)
      : real_(std::move(real)), out_bytes_(std::move(out_bytes)) {}
  void set_param(std::size_t i, const void* data, std::size_t n) override { real_->set_param(i, data, n); }
  void run(std::span<const void* const> inputs, std::span<void* const> outputs) override {
    std::vector<std::vector<std::byte>> scratch;
    std::vector<void*> ptrs;
    for (auto n : out_bytes_) ptrs.push_back(scratch.emplace_back(n).data());
    real_->run(inputs, ptrs);
    for (std::size_t j = 0; j < outputs.size(); ++j) std::memcpy(outputs[j], ptrs[j], out_bytes_[j] / 2);
  }
  std::unique_ptr<runtime::ExecutableGraph> clone() const override {
    return std::make_unique<HalfWritingExe>(real_->clone(), out_bytes_);
  }

 private:
  std::unique_ptr<runtime::ExecutableGraph> real_;
  std::vector<std::size_t> out_bytes_;
};

class HalfWritingBackend : public runtime::Backend {
 public:
  explicit HalfWritingBackend(Device real) : real_(runtime::make_backend(real)) {}
  std::string_view name() const override { return "half_writing"; }
  compile::BackendTraits traits() const override { return real_->traits(); }
  std::unique_ptr<runtime::ExecutableGraph> compile_lir(const compile::LirModule& lir,
                                                        const compile::CompileOptions& options) override {
    std::vector<std::size_t> bytes;
    for (auto id : lir.outputs) bytes.push_back(std::size_t(lir.buffer(id).nbytes()));
    return std::make_unique<HalfWritingExe>(real_->compile_lir(lir, options), std::move(bytes));
  }

 private:
  std::unique_ptr<runtime::Backend> real_;
};

class HarnessSelfTest : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (auto why = unavailable_reason(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(HarnessSelfTest, UnwrittenOutputElementsFail) {
  Device real = GetParam();
  runtime::register_backend(Device::CoreMl, [real] { return std::make_unique<HalfWritingBackend>(real); });
  for (DType t : {DType::F32, DType::F16, DType::I32, DType::I64, DType::U8, DType::Bool}) {
    SCOPED_TRACE(dt(t));
    Graph g;
    auto x = g.input("x", Shape{2, 8}, t);
    g.add_output(t == DType::Bool ? g.binary(OpKind::Or, x, x) : g.binary(OpKind::Max, x, x));
    Check check;
    check.seed = testing::test_seed();
    // Values that are never the poison pattern, so only unwritten elements can differ.
    check.fallback = t == DType::Bool ? bools() : ints_in(0, 3);
    EXPECT_TRUE(matches_reference(real, g, check));
    EXPECT_FALSE(matches_reference(Device::CoreMl, g, check));
  }
}

INSTANTIATE_TEST_SUITE_P(Conformance, HarnessSelfTest, ::testing::ValuesIn(backends()),
                         [](const auto& info) { return std::string(runtime::device_label(info.param)); });

}  // namespace
}  // namespace rlx::conformance
