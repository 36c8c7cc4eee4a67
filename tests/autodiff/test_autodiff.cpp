// rlx::autodiff against finite differences, in float64 on the reference
// interpreter. Every differentiable op has a case; each case is checked three
// ways: the gradient (vjp) against central differences of the loss, the
// tangent (jvp) against central differences of the output and against the
// Jacobian rows the vjp gives, and a Hessian-vector product (both jvp(grad)
// and grad(<grad, v>)) against central differences of the gradient.
//
// The differences are the fourth-order central stencil
// (8 (f(x+h) - f(x-h)) - (f(x+2h) - f(x-2h))) / 12h with h = 1e-4, exact for
// polynomials up to degree 4; its truncation error is ~h^4 and its rounding
// ~1e-12 |f|, far below the 1e-6 relative error the checks allow. Random
// inputs stay 0.05 away from the kinks of relu, abs, floor, round, clamp...,
// and ops that select among elements get pairwise distinct values, so no
// stencil point crosses a kink.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "rlx/autodiff/autodiff.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/models/demo_models.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/test_ops.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

using ir::DType;
using ir::Graph;
using ir::NodeId;
using ir::OpKind;
using ir::Shape;
using ir::Tensor;
using reference::TensorMap;
using Ints = std::vector<std::int64_t>;
using Vals = std::vector<double>;
using Names = std::vector<std::string>;

constexpr DType F = DType::F64;
constexpr double kStep = 1e-4;

Tensor tensor(Ints shape, Vals v, DType dt = F) { return Tensor::from_f64(dt, std::move(shape), v); }

Ints all_axes(const Shape& s) {
  Ints a(s.rank());
  std::iota(a.begin(), a.end(), 0);
  return a;
}

Tensor sample(const Ints& shape, std::mt19937_64& rng, double lo, double hi) {
  Tensor t(F, shape);
  std::uniform_real_distribution<double> u(lo, hi);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    double v;
    do v = u(rng);
    while (std::fabs(2 * v - std::round(2 * v)) < 0.1);  // 0.05 from every multiple of 0.5
    t.set(i, v);
  }
  return t;
}

// ---- cases ------------------------------------------------------------------

struct Case {
  std::string name;
  // Declares its inputs (f64 ones are differentiated unless in `fixed`) and
  // returns the node under test.
  std::function<NodeId(Graph&)> build;
  TensorMap fixed = {};                                          // inputs held constant: indices, conditions, masks
  std::map<std::string, std::pair<double, double>> ranges = {};  // default [-2, 2]
  TensorMap init = {};                                           // chosen values for differentiated inputs
  bool distinct = false;  // differentiated values pairwise >= 0.1 apart (ops that select)
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

// The case's node y, under loss = sum(y * cot) with a random cotangent.
struct Problem {
  Graph g;  // outputs: loss, y
  Names wrt;
  TensorMap values;  // every input, cot included
  std::mt19937_64 rng;
};

Problem make_problem(const Case& c) {
  Problem p{Graph(c.name), {}, {}, std::mt19937_64(testing::test_seed() ^ std::hash<std::string>{}(c.name))};
  NodeId y = c.build(p.g);
  Shape ys = p.g.node(y).shape;
  NodeId cot = p.g.input("cot", ys, F);
  p.g.add_output(p.g.sum(p.g.mul(y, cot), all_axes(ys)), "loss");
  p.g.add_output(y, "y");
  std::int64_t total = 0;
  for (auto id : p.g.input_ids()) {
    const auto& n = p.g.node(id);
    const auto& name = n.attrs.get_str("name");
    auto shape = n.shape.extents();
    if (auto it = c.fixed.find(name); it != c.fixed.end()) {
      p.values[name] = it->second;
    } else if (name == "cot") {
      p.values[name] = sample(shape, p.rng, -1, 1);
    } else if (auto init = c.init.find(name); init != c.init.end()) {
      p.values[name] = init->second;
      p.wrt.push_back(name);
    } else {
      auto r = c.ranges.contains(name) ? c.ranges.at(name) : std::pair{-2.0, 2.0};
      p.values[name] = sample(shape, p.rng, r.first, r.second);
      p.wrt.push_back(name);
      total += n.shape.numel();
    }
  }
  if (c.distinct) {  // a shuffled grid, 0.1 apart, with a little jitter
    Vals grid(static_cast<std::size_t>(total));
    std::uniform_real_distribution<double> jitter(-0.01, 0.01);
    for (std::size_t i = 0; i < grid.size(); ++i) grid[i] = 0.1 * (double(i) - double(total) / 2) + jitter(p.rng);
    std::shuffle(grid.begin(), grid.end(), p.rng);
    std::size_t at = 0;
    for (const auto& w : p.wrt) {
      if (c.init.contains(w)) continue;
      Tensor& t = p.values[w];
      for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, grid[at++]);
    }
  }
  return p;
}

// ---- numerics ---------------------------------------------------------------

Vals flat(const std::vector<Tensor>& ts, std::size_t from = 0, std::size_t count = ~std::size_t{0}) {
  Vals v;
  for (std::size_t i = from; i < ts.size() && i - from < count; ++i) {
    auto x = ts[i].to_f64();
    v.insert(v.end(), x.begin(), x.end());
  }
  return v;
}

TensorMap shifted(TensorMap x, const TensorMap& dir, double s) {
  for (const auto& [name, d] : dir) {
    Tensor& t = x.at(name);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, t.get(i) + s * d.get(i));
  }
  return x;
}

// d/ds f(x + s dir) at s = 0, by the fourth-order central stencil.
Vals directional(const std::function<Vals(const TensorMap&)>& f, const TensorMap& x, const TensorMap& dir) {
  Vals p1 = f(shifted(x, dir, kStep)), m1 = f(shifted(x, dir, -kStep));
  Vals p2 = f(shifted(x, dir, 2 * kStep)), m2 = f(shifted(x, dir, -2 * kStep));
  Vals d(p1.size());
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = (8 * (p1[i] - m1[i]) - (p2[i] - m2[i])) / (12 * kStep);
  return d;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += a.get(i) * b.get(i);
  return s;
}

double max_abs(const Vals& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Relative error 1e-6, plus the stencil's rounding (~1e-12 of the function's
// magnitude `scale`, allowed 100x) for derivatives that are (near) zero.
::testing::AssertionResult close(double got, double want, double scale, double rtol = 1e-6) {
  double err = std::fabs(got - want),
         tol = rtol * std::max(std::fabs(got), std::fabs(want)) + 1e-10 * std::max(1.0, scale);
  if (err <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << got << ", want " << want << " (error " << err << " > " << tol
                                       << ")";
}

::testing::AssertionResult close(const Vals& got, const Vals& want, double scale, double rtol = 1e-6) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << got.size() << " values, want " << want.size();
  double norm = std::max(max_abs(got), max_abs(want));
  for (std::size_t i = 0; i < got.size(); ++i) {
    double err = std::fabs(got[i] - want[i]), tol = rtol * norm + 1e-10 * std::max(1.0, scale);
    if (err > tol)
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", want " << want[i]
                                           << " (error " << err << " > " << tol << ")";
  }
  return ::testing::AssertionSuccess();
}

TensorMap random_directions(Problem& p) {
  TensorMap dir;
  for (const auto& w : p.wrt) dir[w] = sample(p.values.at(w).shape(), p.rng, -1, 1);
  return dir;
}

// ---- the three checks ---------------------------------------------------------

void check_gradient(Problem& p) {
  Graph G = autodiff::grad(p.g, p.wrt);
  auto grads = reference::run(G, p.values);
  ASSERT_EQ(grads.size(), p.wrt.size());
  double loss = reference::run(p.g, p.values)[0].get(0);
  auto loss_at = [&](const TensorMap& x) { return Vals{reference::run(p.g, x)[0].get(0)}; };
  for (std::size_t i = 0; i < p.wrt.size(); ++i) {
    const std::string& w = p.wrt[i];
    const Tensor& x = p.values.at(w);
    ASSERT_EQ(grads[i].shape(), x.shape()) << w;
    ASSERT_EQ(grads[i].dtype(), F) << w;
    TensorMap dir{{w, sample(x.shape(), p.rng, -1, 1)}};
    EXPECT_TRUE(close(dot(grads[i], dir.at(w)), directional(loss_at, p.values, dir)[0], loss))
        << "projection of d loss / d " << w;
    if (x.numel() > 16) continue;
    for (std::int64_t j = 0; j < x.numel(); ++j) {  // every element of small tensors
      Tensor e(F, x.shape());
      e.set(j, 1);
      EXPECT_TRUE(close(grads[i].get(j), directional(loss_at, p.values, {{w, e}})[0], loss))
          << "d loss / d " << w << "[" << j << "]";
    }
  }
}

void check_jvp(Problem& p) {
  Graph J = autodiff::jvp(p.g, p.wrt);
  TensorMap dir = random_directions(p), feed = p.values;
  for (const auto& [w, d] : dir) feed["tangent_" + w] = d;
  auto outs = reference::run(J, feed);
  ASSERT_EQ(outs.size(), 4u);
  EXPECT_EQ(J.outputs()[3].name, "tangent_y");
  Vals y = outs[1].to_f64(), ty = outs[3].to_f64();
  auto y_at = [&](const TensorMap& x) { return reference::run(p.g, x)[1].to_f64(); };
  EXPECT_TRUE(close(ty, directional(y_at, p.values, dir), max_abs(y))) << "J v against differences of y";

  // J v against the rows of J that the vjp gives: (J v)_i = <J^T e_i, v>.
  Graph G = autodiff::grad(p.g, p.wrt);
  std::vector<std::size_t> rows(ty.size());
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), p.rng);
  rows.resize(std::min<std::size_t>(rows.size(), 48));
  for (std::size_t i : rows) {
    TensorMap x = p.values;
    Tensor e(F, x.at("cot").shape());
    e.set(std::int64_t(i), 1);
    x["cot"] = e;
    auto row = reference::run(G, x);
    double jv = 0, mag = 0;
    for (std::size_t k = 0; k < p.wrt.size(); ++k)
      for (std::int64_t j = 0; j < row[k].numel(); ++j) {
        jv += row[k].get(j) * dir.at(p.wrt[k]).get(j);
        mag += std::fabs(row[k].get(j) * dir.at(p.wrt[k]).get(j));
      }
    EXPECT_NEAR(ty[i], jv, 1e-9 * mag + 1e-12) << "(J v)[" << i << "]";
  }
  double vjp_dot = 0;
  auto grads = reference::run(G, p.values);
  for (std::size_t k = 0; k < p.wrt.size(); ++k) vjp_dot += dot(grads[k], dir.at(p.wrt[k]));
  EXPECT_TRUE(close(outs[2].get(0), vjp_dot, outs[0].get(0), 1e-9)) << "<cot, J v> against <J^T cot, v>";
}

void check_hvp(Problem& p) {
  Graph G = autodiff::grad(p.g, p.wrt);
  TensorMap dir = random_directions(p);
  auto grads_at = [&](const TensorMap& x) { return flat(reference::run(G, x)); };
  Vals grads = grads_at(p.values), fd = directional(grads_at, p.values, dir);

  // Forward over reverse: jvp(grad).
  Graph A = autodiff::jvp(G, p.wrt);
  TensorMap feed = p.values;
  for (const auto& [w, d] : dir) feed["tangent_" + w] = d;
  Vals hv_fwd = flat(reference::run(A, feed), p.wrt.size());
  EXPECT_TRUE(close(hv_fwd, fd, max_abs(grads))) << "jvp(grad) against differences of the gradient";

  // Reverse over reverse: grad(<grad, v>).
  Graph B = G;
  B.clear_outputs();
  std::optional<NodeId> total;
  for (std::size_t i = 0; i < p.wrt.size(); ++i) {
    NodeId gi = G.outputs()[i].node;
    Shape s = B.node(gi).shape;
    NodeId term = B.sum(B.mul(gi, B.input("dir_" + p.wrt[i], s, F)), all_axes(s));
    total = total ? B.add(*total, term) : term;
  }
  B.add_output(*total, "gv");
  feed = p.values;
  for (const auto& [w, d] : dir) feed["dir_" + w] = d;
  Vals hv_rev = flat(reference::run(autodiff::grad(B, p.wrt), feed));
  EXPECT_TRUE(close(hv_rev, fd, max_abs(grads))) << "grad(<grad, v>) against differences of the gradient";
  EXPECT_TRUE(close(hv_rev, hv_fwd, 0, 1e-9)) << "the two Hessian-vector products";
}

class OpDerivatives : public ::testing::TestWithParam<Case> {};

TEST_P(OpDerivatives, GradientMatchesFiniteDifferences) {
  Problem p = make_problem(GetParam());
  check_gradient(p);
}
TEST_P(OpDerivatives, JvpMatchesDifferencesAndVjpJacobian) {
  Problem p = make_problem(GetParam());
  check_jvp(p);
}
TEST_P(OpDerivatives, HessianVectorProductMatchesDifferences) {
  Problem p = make_problem(GetParam());
  check_hvp(p);
}

// ---- the op cases -------------------------------------------------------------

NodeId in(Graph& g, const std::string& name, Shape s) { return g.input(name, std::move(s), F); }

std::vector<Case> unary_cases() {
  std::vector<Case> cases;
  const std::pair<double, double> positive{0.5, 2.0};
  // Every unary op of the table (not takes bool): a new one is covered without a line here.
  for (OpKind op : ir::kAllOps) {
    if (ir::op_info(op).cls != ir::OpClass::Unary || op == OpKind::Not) continue;
    Case c{std::string(ir::op_name(op)), [op](Graph& g) { return g.unary(op, in(g, "x", {3, 4})); }};
    if (op == OpKind::Log || op == OpKind::Sqrt || op == OpKind::Rsqrt || op == OpKind::Reciprocal)
      c.ranges["x"] = positive;
    cases.push_back(std::move(c));
  }
  return cases;
}

std::vector<Case> binary_cases() {
  std::vector<Case> cases;
  for (OpKind op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Pow, OpKind::Max, OpKind::Min}) {
    std::string name(ir::op_name(op));
    // b broadcasts into a, then both broadcast into each other.
    Case c1{name + "_broadcast_b", [op](Graph& g) { return g.binary(op, in(g, "a", {2, 3, 4}), in(g, "b", {3, 1})); }};
    Case c2{name + "_broadcast_both", [op](Graph& g) { return g.binary(op, in(g, "a", {4}), in(g, "b", {2, 1})); }};
    for (Case* c : {&c1, &c2}) {
      if (op == OpKind::Div) c->ranges["b"] = {0.5, 2.0};
      if (op == OpKind::Pow) c->ranges["a"] = {0.5, 2.0};
      c->distinct = op == OpKind::Max || op == OpKind::Min;
      cases.push_back(*c);
    }
  }
  // mod is discontinuous in a where a/b is an integer: values chosen well away.
  cases.push_back({"mod",
                   [](Graph& g) {
                     return g.binary(OpKind::Mod, in(g, "a", {2, 3}), in(g, "b", {3}));
                   },
                   {},
                   {},
                   {{"a", tensor({2, 3}, {0.3, 1.7, -0.6, 2.6, -2.5, 0.75})}, {"b", tensor({3}, {0.7, -1.1, 0.9})}}});
  return cases;
}

std::vector<Case> elementwise_cases() {
  return {
      {"where",
       [](Graph& g) {
         return g.where(g.input("c", {3, 4}, DType::Bool), in(g, "a", {3, 4}), in(g, "b", {4}));
       },
       {{"c", tensor({3, 4}, {1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 0, 1}, DType::Bool)}}},
      {"clamp",
       [](Graph& g) {
         return g.clamp(in(g, "x", {3, 4}), -1.0, 1.0);
       }},
      {"uses_accumulate",  // x three times: cotangents add up
       [](Graph& g) {
         NodeId x = in(g, "x", {3, 4});
         return g.add(g.mul(x, x), g.mul(g.unary(OpKind::Sin, x), x));
       }},
  };
}

std::vector<Case> reduce_cases() {
  auto red = [](OpKind op, Ints axes, bool keep) {
    return [=](Graph& g) { return g.reduce(op, in(g, "x", {2, 3, 4}), axes, keep); };
  };
  return {
      {"reduce_sum", red(OpKind::ReduceSum, {1}, false)},
      {"reduce_sum_keepdims", red(OpKind::ReduceSum, {0, 2}, true)},
      {"reduce_sum_all", red(OpKind::ReduceSum, {0, 1, 2}, false)},
      {"reduce_mean", red(OpKind::ReduceMean, {2}, false)},
      {"reduce_mean_keepdims", red(OpKind::ReduceMean, {0, 1}, true)},
      {"reduce_max", red(OpKind::ReduceMax, {1}, false), {}, {}, {}, true},
      {"reduce_min_keepdims", red(OpKind::ReduceMin, {0, 2}, true), {}, {}, {}, true},
      {"reduce_prod", red(OpKind::ReduceProd, {2}, false), {}, {{"x", {0.5, 1.5}}}},
      // Groups with no zero, one zero and two zeros: the product of the others.
      {"reduce_prod_zeros",
       [](Graph& g) {
         return g.reduce(OpKind::ReduceProd, in(g, "x", {3, 4}), {1}, false);
       },
       {},
       {},
       {{"x", tensor({3, 4}, {0.5, 1.5, -2, 0.7, 0, 1.2, -0.8, 2, 0, 0, 1.1, 0.9})}}},
  };
}

std::vector<Case> matmul_cases() {
  auto mm = [](Shape a, Shape b) { return [=](Graph& g) { return g.matmul(in(g, "a", a), in(g, "b", b)); }; };
  return {
      {"matmul", mm({3, 4}, {4, 2})},
      {"matmul_batched", mm({2, 3, 4}, {4, 5})},
      {"matmul_broadcast_a", mm({3, 4}, {2, 4, 2})},
      {"matmul_broadcast_unit_batch", mm({1, 3, 4}, {2, 4, 2})},
  };
}

std::vector<Case> movement_cases() {
  auto idx = [](Ints shape, Vals v) { return tensor(std::move(shape), std::move(v), DType::I64); };
  return {
      {"reshape",
       [](Graph& g) {
         return g.reshape(in(g, "x", {2, 3, 4}), Ints{6, 4});
       }},
      {"permute",
       [](Graph& g) {
         return g.permute(in(g, "x", {2, 3, 4}), {2, 0, 1});
       }},
      {"expand",
       [](Graph& g) {
         return g.expand(in(g, "x", {3, 1}), Shape{2, 3, 4});
       }},
      {"slice",
       [](Graph& g) {
         return g.slice(in(g, "x", {4, 5}), {1}, {1}, {4});
       }},
      {"slice_strided",
       [](Graph& g) {
         return g.slice(in(g, "x", {5, 7}), {0, 1}, {1, 0}, {5, 7}, {2, 3});
       }},
      {"concat",
       [](Graph& g) {
         return g.concat({in(g, "a", {2, 1}), in(g, "b", {2, 3}), in(g, "c", {2, 2})}, 1);
       }},
      {"pad",
       [](Graph& g) {
         return g.pad(in(g, "x", {2, 3}), {1, 0, 2, 1}, 0.5);
       }},
      {"pad_crop",
       [](Graph& g) {
         return g.pad(in(g, "x", {3, 4}), {-1, 1, 0, -2});
       }},
      {"gather",
       [](Graph& g) {
         return g.gather(in(g, "x", {3, 4}), g.input("i", {2, 4}, DType::I64), 0);
       },
       {{"i", idx({2, 4}, {0, 2, 2, 1, 1, 0, 2, 2})}}},
      {"gather_narrow_index",
       [](Graph& g) {
         return g.gather(in(g, "x", {3, 4}), g.input("i", {2, 3}, DType::I64), 1);
       },
       {{"i", idx({2, 3}, {3, 0, 3, 1, 1, -1})}}},
      {"index_select",
       [](Graph& g) {
         return g.index_select(in(g, "x", {4, 3}), g.input("i", {2, 2}, DType::I64), 0);
       },
       {{"i", idx({2, 2}, {3, 0, 3, 1})}}},
      {"index_select_inner",
       [](Graph& g) {
         return g.index_select(in(g, "x", {2, 4, 3}), g.input("i", {5}, DType::I64), 1);
       },
       {{"i", idx({5}, {1, 1, 0, 3, 1})}}},
      {"scatter_add",
       [](Graph& g) {
         return g.scatter_add(in(g, "x", {3, 4}), g.input("i", {2, 4}, DType::I64), in(g, "u", {2, 4}), 0);
       },
       {{"i", idx({2, 4}, {0, 2, 2, 1, 0, 2, 1, 1})}}},
      {"flip",
       [](Graph& g) {
         return g.flip(in(g, "x", {2, 3, 4}), {0, 2});
       }},
      {"squeeze",
       [](Graph& g) {
         return g.squeeze(in(g, "x", {2, 1, 3, 1}), {1, 3});
       }},
      {"unsqueeze",
       [](Graph& g) {
         return g.unsqueeze(in(g, "x", {2, 3}), {0, 2});
       }},
  };
}

std::vector<Case> composite_cases() {
  auto ids = [](Ints shape, Vals v) { return tensor(std::move(shape), std::move(v), DType::I64); };
  rlx::testing::register_test_ops();
  return {
      {"custom_through_lowering",
       [](Graph& g) {
         return g.custom_op("test_scaled_silu", {{"alpha", 1.5}}, {in(g, "x", {2, 3})});
       }},
      {"linear_vector",
       [](Graph& g) {
         return g.linear(in(g, "x", {4}), in(g, "w", {4, 3}), in(g, "b", {3}));
       }},
      {"linear",
       [](Graph& g) {
         return g.linear(in(g, "x", {2, 4}), in(g, "w", {4, 3}), in(g, "b", {3}));
       }},
      {"linear_batched",
       [](Graph& g) {
         return g.linear(in(g, "x", {2, 3, 4}), in(g, "w", {4, 3}), in(g, "b", {3}));
       }},
      {"linear_no_bias",
       [](Graph& g) {
         return g.linear(in(g, "x", {3, 4}), in(g, "w", {4, 2}));
       }},
      {"softmax",
       [](Graph& g) {
         return g.softmax(in(g, "x", {3, 4}), -1);
       }},
      {"softmax_axis0",
       [](Graph& g) {
         return g.softmax(in(g, "x", {3, 4}), 0);
       }},
      {"log_softmax",
       [](Graph& g) {
         return g.log_softmax(in(g, "x", {3, 4}), -1);
       }},
      {"log_softmax_middle",
       [](Graph& g) {
         return g.log_softmax(in(g, "x", {2, 3, 4}), 1);
       }},
      {"layer_norm",
       [](Graph& g) {
         return g.layer_norm(in(g, "x", {3, 4}), in(g, "gamma", {4}), in(g, "beta", {4}), 1e-5);
       }},
      {"layer_norm_two_dims",
       [](Graph& g) {
         return g.layer_norm(in(g, "x", {2, 3, 4}), in(g, "gamma", {3, 4}), in(g, "beta", {3, 4}), 1e-3, -2);
       }},
      {"layer_norm_plain",
       [](Graph& g) {
         return g.layer_norm(in(g, "x", {3, 5}), std::nullopt, std::nullopt);
       }},
      {"rms_norm",
       [](Graph& g) {
         return g.rms_norm(in(g, "x", {3, 4}), in(g, "gamma", {4}), 1e-6);
       }},
      {"rms_norm_plain",
       [](Graph& g) {
         return g.rms_norm(in(g, "x", {2, 3, 4}), std::nullopt);
       }},
      {"group_norm",
       [](Graph& g) {
         return g.group_norm(in(g, "x", {2, 4, 3}), 2, in(g, "gamma", {4}), in(g, "beta", {4}));
       }},
      {"group_norm_plain",
       [](Graph& g) {
         return g.group_norm(in(g, "x", {2, 6}), 3);
       }},
      {"conv1d",
       [](Graph& g) {
         return g.conv1d(in(g, "x", {1, 2, 5}), in(g, "w", {3, 2, 2}), in(g, "b", {3}));
       }},
      {"conv1d_grouped_strided_dilated",
       [](Graph& g) {
         return g.conv1d(in(g, "x", {2, 4, 7}), in(g, "w", {6, 2, 3}), in(g, "b", {6}), 2, 1, 2, 2);
       }},
      {"conv2d",
       [](Graph& g) {
         return g.conv2d(in(g, "x", {1, 3, 4, 4}), in(g, "w", {2, 3, 2, 2}), in(g, "b", {2}), {1, 1}, {1, 1});
       }},
      {"conv2d_grouped_strided_dilated",
       [](Graph& g) {
         return g.conv2d(in(g, "x", {2, 2, 5, 5}), in(g, "w", {4, 1, 3, 2}), std::nullopt, {2, 1}, {1, 0}, {1, 2}, 2);
       }},
      {"max_pool2d",
       [](Graph& g) {
         return g.max_pool2d(in(g, "x", {2, 2, 4, 4}), {2, 2}, {2, 2});
       },
       {},
       {},
       {},
       true},
      {"max_pool2d_padded_overlapping",
       [](Graph& g) {
         return g.max_pool2d(in(g, "x", {1, 2, 5, 5}), {3, 3}, {2, 2}, {1, 1});
       },
       {},
       {},
       {},
       true},
      {"avg_pool2d",
       [](Graph& g) {
         return g.avg_pool2d(in(g, "x", {1, 2, 5, 5}), {3, 3}, {2, 2}, {1, 1});
       }},
      {"embedding",
       [](Graph& g) {
         return g.embedding(in(g, "table", {5, 3}), g.input("ids", {2, 3}, DType::I64));
       },
       {{"ids", ids({2, 3}, {4, 0, 4, 2, 2, 1})}}},
      {"dynamic_update_slice",
       [](Graph& g) {
         return g.dynamic_update_slice(in(g, "x", {3, 5, 2}), in(g, "u", {3, 2, 2}), g.input("s", {}, DType::I64), 1);
       },
       {{"s", ids({}, {2})}}},
      {"dynamic_update_slice_clamped",
       [](Graph& g) {
         return g.dynamic_update_slice(in(g, "x", {4, 3}), in(g, "u", {3, 3}), g.input("s", {1}, DType::I64), 0);
       },
       {{"s", ids({1}, {7})}}},
      {"rope_interleaved",
       [](Graph& g) {
         return g.rope(in(g, "x", {3, 2, 4}), in(g, "c", {3, 1, 2}), in(g, "s", {3, 1, 2}));
       }},
      {"rope_halves",
       [](Graph& g) {
         return g.rope(in(g, "x", {2, 6}), in(g, "c", {3}), in(g, "s", {2, 3}), false);
       }},
      {"attention",
       [](Graph& g) {
         return g.attention(in(g, "q", {1, 2, 3, 4}), in(g, "k", {1, 2, 3, 4}), in(g, "v", {1, 2, 3, 4}));
       }},
      {"attention_grouped_kv_heads",
       [](Graph& g) {
         return g.attention(in(g, "q", {1, 4, 3, 4}), in(g, "k", {1, 2, 5, 4}), in(g, "v", {1, 2, 5, 3}));
       }},
      {"attention_causal_scaled",
       [](Graph& g) {
         return g.attention(in(g, "q", {1, 2, 3, 4}), in(g, "k", {1, 2, 5, 4}), in(g, "v", {1, 2, 5, 2}), std::nullopt,
                            true, 0.7);
       }},
      {"attention_bool_mask",
       [](Graph& g) {
         return g.attention(in(g, "q", {2, 1, 3, 4}), in(g, "k", {2, 1, 3, 4}), in(g, "v", {2, 1, 3, 4}),
                            g.input("m", {1, 1, 3, 3}, DType::Bool));
       },
       {{"m", tensor({1, 1, 3, 3}, {1, 0, 1, 1, 1, 0, 0, 1, 1}, DType::Bool)}}},
      // The backward ops the rules above emit, differentiated again (second and third order).
      {"softmax_backward",
       [](Graph& g) {
         return g.add(OpKind::SoftmaxBackward, {in(g, "y", {3, 4}), in(g, "dy", {3, 4})}, {{"axis", std::int64_t(-1)}});
       }},
      {"log_softmax_backward",
       [](Graph& g) {
         return g.add(OpKind::LogSoftmaxBackward, {in(g, "y", {3, 4}), in(g, "dy", {3, 4})},
                      {{"axis", std::int64_t(0)}});
       }},
      {"layer_norm_backward",
       [](Graph& g) {
         NodeId x = in(g, "x", {2, 3, 4}), dy = in(g, "dy", {2, 3, 4}), gamma = in(g, "gamma", {3, 4});
         return g.add(OpKind::LayerNormBackward, {x, dy, gamma}, {{"axis", std::int64_t(1)}, {"eps", 1e-3}});
       }},
      {"rms_norm_backward",
       [](Graph& g) {
         return g.add(OpKind::RmsNormBackward, {in(g, "x", {3, 4}), in(g, "dy", {3, 4})}, {{"eps", 1e-6}});
       }},
      {"attention_float_mask",  // an additive mask is differentiated too
       [](Graph& g) {
         return g.attention(in(g, "q", {1, 2, 3, 4}), in(g, "k", {1, 2, 3, 4}), in(g, "v", {1, 2, 3, 4}),
                            in(g, "m", {3, 3}));
       }},
  };
}

// Control flow (more in test_scan_grad.cpp): bodies with a nonlinear carry.
std::vector<Case> control_flow_cases() {
  auto cell = [] {  // (h, x, w) -> (tanh(h * w + x), h * x)
    Graph b("cell");
    NodeId h = in(b, "h", {2}), x = in(b, "x", {2}), w = in(b, "w", {2});
    b.set_outputs({b.unary(OpKind::Tanh, b.add(b.mul(h, w), x)), b.mul(h, x)});
    return ir::body_ref(std::move(b));
  };
  auto scan = [cell](bool reverse, std::size_t result) {
    return [=](Graph& g) {
      return ir::scan(g, cell(), {in(g, "h0", {2})}, {in(g, "xs", {4, 2})}, 4, reverse, {in(g, "w", {2})})[result];
    };
  };
  return {
      {"scan_ys", scan(false, 1)},
      {"scan_final_carry_reverse", scan(true, 0)},
      {"if",
       [](Graph& g) {
         Graph t("t"), e("e");
         NodeId a = in(t, "a", {3}), b = in(t, "b", {3});
         t.add_output(t.mul(t.unary(OpKind::Sin, a), b));
         NodeId a2 = in(e, "a", {3}), b2 = in(e, "b", {3});
         e.add_output(e.sub(a2, b2));
         return ir::if_else(g, g.input("p", {}, DType::Bool), ir::body_ref(std::move(t)), ir::body_ref(std::move(e)),
                            {in(g, "x", {3}), in(g, "y", {3})})[0];
       },
       {{"p", tensor({}, {1}, DType::Bool)}}},
      {"while_bounded",  // three trips of v = tanh(v * a), counted by an i64 carry
       [](Graph& g) {
         Graph c("c"), b("b");
         NodeId i = c.input("i", {}, DType::I64);
         in(c, "v", {2});
         in(c, "a", {2});
         c.add_output(c.binary(OpKind::Lt, i, c.scalar(3, DType::I64)));
         NodeId bi = b.input("i", {}, DType::I64), v = in(b, "v", {2}), a = in(b, "a", {2});
         b.set_outputs({b.add(bi, b.scalar(1, DType::I64)), b.unary(OpKind::Tanh, b.mul(v, a))});
         return ir::while_loop(g, ir::body_ref(std::move(c)), ir::body_ref(std::move(b)),
                               {g.scalar(0, DType::I64), in(g, "v0", {2})}, {in(g, "a", {2})}, 5)[1];
       }},
  };
}

std::vector<Case> all_cases() {
  std::vector<Case> all;
  for (auto part : {unary_cases(), binary_cases(), elementwise_cases(), reduce_cases(), matmul_cases(),
                    movement_cases(), composite_cases(), control_flow_cases()})
    all.insert(all.end(), part.begin(), part.end());
  return all;
}

INSTANTIATE_TEST_SUITE_P(Ops, OpDerivatives, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Every op of the closed set is either covered above or deliberately not
// differentiable; a new op fails here until it gets a rule and a case.
TEST(Autodiff, EveryOpHasACaseOrIsNonDifferentiable) {
  std::set<std::string> covered;
  for (const auto& c : all_cases()) {
    Problem p = make_problem(c);
    for (const auto& n : p.g.nodes()) covered.insert(std::string(ir::op_name(n.op)));
  }
  covered.insert("cast");  // checked exactly below: float casts round, so differences cannot resolve them
  const std::set<std::string> leaves{"param", "constant", "iota", "random_uniform", "random_normal"};
  const std::set<std::string> non_differentiable{"not", "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "argmax",
                                                 "argmin",
                                                 // block-quantized storage has no tangent space; quantized_matmul's
                                                 // derivative in x comes through its decomposition, but it takes
                                                 // f32 only, which these f64 finite-difference cases cannot check
                                                 "dequantize", "quantize", "quantized_matmul"};
  for (OpKind op : ir::kAllOps) {
    std::string name(ir::op_name(op));
    EXPECT_TRUE(covered.contains(name) || leaves.contains(name) || non_differentiable.contains(name))
        << name << " has no derivative case";
  }
}

// ---- beyond single ops ----------------------------------------------------------

std::vector<Tensor> run(const Graph& g, const TensorMap& inputs, const TensorMap& params = {}) {
  return reference::run(g, inputs, params);
}

using rlx::testing::expect_error;

TEST(Autodiff, CastGradientIsTheCotangentInTheSourceDType) {
  Graph g("cast");
  NodeId x = in(g, "x", {3});
  NodeId y = g.cast(x, DType::F32);
  NodeId c = g.constant(tensor({3}, {0.5, -2, 3}, DType::F32));
  g.add_output(g.sum(g.mul(g.mul(y, y), c), {0}), "loss");
  TensorMap v{{"x", tensor({3}, {1.5, 2, -1})}};
  auto gr = run(autodiff::grad(g, {"x"}), v);
  EXPECT_TRUE(testing::tensors_close(gr[0], tensor({3}, {1.5, -8, -6})));  // 2 x c, exact in f32
  auto t = run(autodiff::jvp(g, {"x"}), {{"x", v.at("x")}, {"tangent_x", tensor({3}, {1, 1, 1})}});
  EXPECT_EQ(t[1].dtype(), DType::F32);
  EXPECT_DOUBLE_EQ(t[1].get(0), 1.5 - 8 - 6);
}

TEST(Autodiff, ValueAndGradPutsTheLossFirst) {
  Graph g("f");
  NodeId x = in(g, "x", {4});
  NodeId w = g.param("w", {4}, F);
  g.add_output(g.sum(g.mul(g.exp(x), w), {0}), "loss");
  g.add_output(x, "other");  // ignored by reverse mode
  TensorMap v{{"x", tensor({4}, {0.1, -0.2, 0.3, 1})}}, p{{"w", tensor({4}, {1, 2, 3, 4})}};
  Graph vg = autodiff::value_and_grad(g, {"w", "x"});
  ASSERT_EQ(vg.outputs().size(), 3u);
  EXPECT_EQ(vg.outputs()[0].name, "loss");
  EXPECT_EQ(vg.outputs()[1].name, "grad_w");
  EXPECT_EQ(vg.input_ids(), g.input_ids());
  EXPECT_EQ(vg.param_ids(), g.param_ids());
  auto out = run(vg, v, p);
  EXPECT_TRUE(testing::tensors_close(out[0], run(g, v, p)[0]));
  for (int i = 0; i < 4; ++i) {
    EXPECT_DOUBLE_EQ(out[1].get(i), std::exp(v.at("x").get(i)));
    EXPECT_DOUBLE_EQ(out[2].get(i), std::exp(v.at("x").get(i)) * p.at("w").get(i));
  }
}

TEST(Autodiff, UnrelatedInputsGetZeroGradients) {
  Graph g("f");
  NodeId x = in(g, "x", {2});
  in(g, "unused", {2, 3});
  g.add_output(g.sum(g.mul(x, x), {0}), "loss");
  auto out = run(autodiff::grad(g, {"unused", "x"}), {{"x", tensor({2}, {1, -3})}, {"unused", Tensor(F, {2, 3})}});
  EXPECT_TRUE(testing::tensors_close(out[0], Tensor(F, {2, 3})));
  EXPECT_TRUE(testing::tensors_close(out[1], tensor({2}, {2, -6})));
}

// At a tie max and min are not differentiable; like torch and JAX the
// derivative is shared evenly among the tied elements.
TEST(Autodiff, TiesShareTheDerivativeEvenly) {
  Graph g("ties");
  NodeId m = g.binary(OpKind::Max, in(g, "a", {3}), in(g, "b", {3}));
  NodeId r = g.reduce(OpKind::ReduceMin, in(g, "x", {2, 3}), {1});
  g.add_output(g.add(g.sum(m, {0}), g.sum(r, {0})), "loss");
  TensorMap v{{"a", tensor({3}, {1, 2, 3})}, {"b", tensor({3}, {1, 0, 5})}, {"x", tensor({2, 3}, {4, 4, 4, 1, 2, 1})}};
  auto out = run(autodiff::grad(g, {"a", "b", "x"}), v);
  EXPECT_TRUE(testing::tensors_close(out[0], tensor({3}, {0.5, 1, 0})));
  EXPECT_TRUE(testing::tensors_close(out[1], tensor({3}, {0.5, 0, 1})));
  EXPECT_TRUE(testing::tensors_close(out[2], tensor({2, 3}, {1.0 / 3, 1.0 / 3, 1.0 / 3, 0.5, 0, 0.5})));
}

// Symbolic dims survive: the derivative graph binds them like its source.
TEST(Autodiff, SymbolicBatchDim) {
  Graph g("sym");
  NodeId x = g.input("x", Shape(std::vector<ir::Dim>{ir::Dim::symbol("B"), ir::Dim(3)}), F);
  NodeId w = g.param("w", {3, 2}, F), b = g.param("b", {2}, F);
  g.input("unused", Shape(std::vector<ir::Dim>{ir::Dim::symbol("B")}), F);
  g.add_output(g.sum(g.unary(OpKind::Tanh, g.linear(x, w, b)), {0, 1}), "loss");
  Graph G = autodiff::grad(g, {"w", "b", "x", "unused"});
  std::mt19937_64 rng(testing::test_seed());
  TensorMap v{{"x", sample({4, 3}, rng, -1, 1)}, {"unused", Tensor(F, {4})}},
      p{{"w", sample({3, 2}, rng, -1, 1)}, {"b", sample({2}, rng, -1, 1)}};
  auto out = run(G, v, p);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[2].shape(), (Ints{4, 3}));
  EXPECT_EQ(out[3].shape(), (Ints{4}));
  // d/db = sum over rows of 1 - tanh^2: recompute directly.
  auto y = run(
      [&] {
        Graph h("h");
        NodeId t =
            h.unary(OpKind::Tanh, h.linear(h.input("x", {4, 3}, F), h.param("w", {3, 2}, F), h.param("b", {2}, F)));
        h.add_output(h.sum(h.sub(h.scalar(1, F), h.mul(t, t)), {0}));
        return h;
      }(),
      {{"x", v.at("x")}}, p);
  EXPECT_TRUE(testing::tensors_close(out[1], y[0]));
}

TEST(Autodiff, StopGradientTreatsANodeAsAConstant) {
  Graph g("f");
  NodeId x = in(g, "x", {3});
  NodeId e = g.exp(x);
  g.add_output(g.sum(g.mul(x, e), {0}), "loss");
  TensorMap v{{"x", tensor({3}, {0.5, -1, 2})}};
  autodiff::Options stop{.stop_gradient = {e}};
  auto plain = run(autodiff::grad(g, {"x"}), v), stopped = run(autodiff::grad(g, {"x"}, stop), v);
  auto fwd = run(autodiff::jvp(g, {"x"}, stop), {{"x", v.at("x")}, {"tangent_x", tensor({3}, {1, 0, 0})}});
  for (int i = 0; i < 3; ++i) {
    double xi = v.at("x").get(i);
    EXPECT_DOUBLE_EQ(plain[0].get(i), std::exp(xi) * (1 + xi));
    EXPECT_DOUBLE_EQ(stopped[0].get(i), std::exp(xi));
  }
  EXPECT_DOUBLE_EQ(fwd[1].get(0), std::exp(0.5));
}

// Selectors (where's condition, gather's indices) carry no derivative, so
// comparisons and argmax feeding them are fine.
TEST(Autodiff, SelectorsMayDependOnDifferentiatedValues) {
  Graph g("f");
  NodeId x = in(g, "x", {2, 3});
  NodeId leaky = g.where(g.binary(OpKind::Gt, x, g.scalar(0, F)), x, g.mul(x, g.scalar(0.1, F)));
  NodeId best = g.gather(x, g.argmax(x, 1, true), 1);  // the row maxima, via their indices
  g.add_output(g.add(g.sum(leaky, {0, 1}), g.sum(best, {0, 1})), "loss");
  auto out = run(autodiff::grad(g, {"x"}), {{"x", tensor({2, 3}, {1, -2, 3, -1, -0.5, -3})}});
  EXPECT_TRUE(testing::tensors_close(out[0], tensor({2, 3}, {1, 0.1, 2, 0.1, 1.1, 0.1})));
}

TEST(Autodiff, NonDifferentiableOpOnThePathIsAnError) {
  Graph g("f");
  NodeId x = in(g, "x", {2, 3});
  NodeId am = g.argmax(x, 1);
  NodeId scaled = g.mul(g.sum(x, {1}), g.cast(am, F));
  g.add_output(g.sum(scaled, {0}), "loss");
  g.add_output(scaled, "scaled");
  expect_error([&] { autodiff::grad(g, {"x"}); }, {"node %" + std::to_string(am), "(argmax)", "not differentiable"});
  expect_error([&] { autodiff::jvp(g, {"x"}); }, {"(argmax)", "not differentiable"});
  // The caller can declare the zero derivative intended.
  auto out = run(autodiff::grad(g, {"x"}, {.stop_gradient = {am}}), {{"x", tensor({2, 3}, {1, 5, 2, 7, 0, 1})}});
  EXPECT_TRUE(testing::tensors_close(out[0], tensor({2, 3}, {1, 1, 1, 0, 0, 0})));

  Graph h("h");
  NodeId y = in(h, "y", {3});
  NodeId positive = h.cast(h.binary(OpKind::Gt, y, h.scalar(0, F)), F);  // a comparison, not a where()
  h.add_output(h.sum(h.mul(positive, y), {0}), "loss");
  expect_error([&] { autodiff::grad(h, {"y"}); }, {"(gt)", "not differentiable"});

  Graph k("k");
  NodeId z = in(k, "z", {3});
  k.add_output(k.sum(k.cast(k.cast(z, DType::I32), F), {0}), "loss");
  expect_error([&] { autodiff::grad(k, {"z"}); }, {"(cast)", "i32"});
}

TEST(Autodiff, BadRequestsAreErrors) {
  Graph g("model");
  NodeId x = in(g, "x", {2, 3});
  NodeId w = g.param("w", {3}, F);
  g.input("ids", {2}, DType::I64);
  NodeId y = g.mul(x, w);
  g.add_output(y, "y");
  expect_error([&] { autodiff::grad(g, {"x"}); }, {"scalar", "f64[2,3]", "model"});
  g.clear_outputs();
  g.add_output(g.sum(y, {0, 1}), "loss");
  expect_error([&] { autodiff::grad(g, {"x", "nope"}); }, {"'nope'", "x, w, ids"});
  expect_error([&] { autodiff::jvp(g, {"nope"}); }, {"'nope'", "x, w, ids"});
  expect_error([&] { autodiff::grad(g, {"ids"}); }, {"'ids'", "i64"});
  expect_error([&] { autodiff::jvp(g, {"x", "x"}); }, {"'x' twice"});
  expect_error([&] { autodiff::grad(g, {"x"}, {.stop_gradient = {999}}); }, {"%999"});
  Graph empty("empty");
  in(empty, "x", {1});
  expect_error([&] { autodiff::grad(empty, {"x"}); }, {"no outputs"});
}

// A classifier step in float64: value_and_grad of a cross-entropy loss over a
// two-layer MLP, checked against differences, then its Hessian-vector product.
TEST(Autodiff, MlpCrossEntropyGradientAndHessian) {
  Graph g("mlp_loss");
  NodeId x = in(g, "x", {4, 5});
  NodeId labels = g.input("labels", {4}, DType::I64);
  NodeId h = g.unary(OpKind::Tanh, g.linear(x, g.param("w0", {5, 6}, F), g.param("b0", {6}, F)));
  NodeId logits = g.linear(h, g.param("w1", {6, 3}, F), g.param("b1", {3}, F));
  NodeId onehot = g.binary(OpKind::Eq, g.iota(Shape{4, 3}, 1), g.unsqueeze(labels, {1}));
  NodeId picked = g.where(onehot, g.log_softmax(logits, -1), g.scalar(0, F));
  g.add_output(g.mul(g.sum(picked, {0, 1}), g.scalar(-0.25, F)), "loss");

  std::mt19937_64 rng(testing::test_seed());
  Names wrt{"w0", "b0", "w1", "b1", "x"};
  TensorMap values{{"labels", tensor({4}, {0, 2, 1, 2}, DType::I64)}};
  for (const auto& name : wrt) {
    auto id = name == "x" ? g.find_input(name) : g.find_param(name);
    values[name] = sample(g.node(id).shape.extents(), rng, -1, 1);
  }
  // Params are fed as inputs of the same name through a copy where they are inputs.
  TensorMap ins{{"x", values.at("x")}, {"labels", values.at("labels")}}, params;
  for (const auto& name : wrt)
    if (name != "x") params[name] = values.at(name);
  auto loss_at = [&](const TensorMap& v) {
    TensorMap i{{"x", v.at("x")}, {"labels", v.at("labels")}}, p;
    for (const auto& name : wrt)
      if (name != "x") p[name] = v.at(name);
    return Vals{run(g, i, p)[0].get(0)};
  };
  Graph vg = autodiff::value_and_grad(g, wrt);
  auto out = run(vg, ins, params);
  EXPECT_TRUE(testing::tensors_close(out[0], run(g, ins, params)[0]));
  for (std::size_t i = 0; i < wrt.size(); ++i) {
    TensorMap dir{{wrt[i], sample(values.at(wrt[i]).shape(), rng, -1, 1)}};
    EXPECT_TRUE(close(dot(out[i + 1], dir.at(wrt[i])), directional(loss_at, values, dir)[0], 1)) << wrt[i];
  }

  // H v for all parameters at once, both ways.
  Graph G = autodiff::grad(g, wrt);
  TensorMap dir;
  for (const auto& name : wrt) dir[name] = sample(values.at(name).shape(), rng, -1, 1);
  auto grads_at = [&](const TensorMap& v) {
    TensorMap i{{"x", v.at("x")}, {"labels", v.at("labels")}}, p;
    for (const auto& name : wrt)
      if (name != "x") p[name] = v.at(name);
    return flat(run(G, i, p));
  };
  Vals fd = directional(grads_at, values, dir);
  TensorMap feed = ins;
  for (const auto& [name, d] : dir) feed["tangent_" + name] = d;
  Vals hv = flat(run(autodiff::jvp(G, wrt), feed, params), wrt.size());
  EXPECT_TRUE(close(hv, fd, max_abs(grads_at(values))));
}

// f(x) = sum(x exp(x)): f' = (1 + x) e^x, f'' = (2 + x) e^x, f''' = (3 + x) e^x,
// each taken as grad(sum(previous)) since the Hessian here is diagonal.
TEST(Autodiff, ThirdDerivativeByRepeatedGrad) {
  Graph g("f");
  NodeId x = in(g, "x", {4});
  g.add_output(g.sum(g.mul(x, g.exp(x)), {0}), "f");
  Graph d = g;
  for (double k : {1.0, 2.0, 3.0}) {
    d = autodiff::grad(d, {"x"});
    TensorMap v{{"x", tensor({4}, {-1.5, -0.2, 0.4, 1.3})}};
    auto out = run(d, v);
    for (int i = 0; i < 4; ++i) {
      double xi = v.at("x").get(i);
      EXPECT_NEAR(out[0].get(i), (k + xi) * std::exp(xi), 1e-12) << "order " << k;
    }
    NodeId s = d.sum(d.outputs()[0].node, {0});
    d.clear_outputs();
    d.add_output(s, "sum");
  }
}

// ---- compiled -----------------------------------------------------------------

std::vector<runtime::NamedTensor> named(const TensorMap& m) {
  std::vector<runtime::NamedTensor> out;
  for (const auto& [k, v] : m) out.push_back({k, ir::view(v)});
  return out;
}

// Compiled on the CPU in f32 against the reference running the same graph.
void expect_compiled_matches_reference(const Graph& grads, const TensorMap& inputs, const TensorMap& params) {
  auto compiled = Session().compile(grads);
  for (const auto& [k, v] : params) compiled.set_param(k, v);
  auto got = compiled.run(named(inputs));
  auto want = reference::run(grads, inputs, params);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    Vals w = want[i].to_f64();
    double scale = std::max(max_abs(w), 1e-3);
    EXPECT_TRUE(testing::tensors_close(got[i], want[i], {1e-4 * scale, 1e-3})) << grads.outputs()[i].name;
  }
}

TEST(AutodiffCompiled, MlpLossGradientOnCpu) {
  auto g = models::mlp({8, 32, 3});
  NodeId labels = g.input("labels", {8}, DType::I64);
  NodeId logits = g.outputs()[0].node;
  NodeId onehot = g.binary(OpKind::Eq, g.iota(Shape{8, 32}, 1), g.unsqueeze(labels, {1}));
  NodeId picked = g.where(onehot, g.log_softmax(logits, -1), g.scalar(0, DType::F32));
  g.clear_outputs();
  g.add_output(g.mul(g.sum(picked, {0, 1}), g.scalar(-1.0 / 8, DType::F32)), "loss");
  auto inputs = models::random_inputs(g, 11);
  inputs["labels"] = tensor({8}, {0, 31, 5, 5, 17, 2, 9, 30}, DType::I64);
  expect_compiled_matches_reference(autodiff::value_and_grad(g, {"w0", "b0", "w1", "b1", "w2", "b2", "x"}), inputs,
                                    models::random_params(g, 12));
}

TEST(AutodiffCompiled, EncoderBlockGradientOnCpu) {
  auto g = models::encoder_block({1, 4, 8, 2, 16, 1e-5});
  NodeId y = g.outputs()[0].node;
  g.clear_outputs();
  g.add_output(g.mean(g.mul(y, y), {0, 1, 2}), "loss");
  Names wrt{"x"};
  for (auto id : g.param_ids()) wrt.push_back(g.node(id).attrs.get_str("name"));
  expect_compiled_matches_reference(autodiff::grad(g, wrt), models::random_inputs(g, 13), models::random_params(g, 14));
}

}  // namespace
}  // namespace rlx
