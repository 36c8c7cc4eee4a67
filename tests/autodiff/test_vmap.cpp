// vmap against running the graph once per example (float64 reference
// interpreter) and stacking the results. Every op of the closed set has a
// case; each case is batched over every subset of its inputs and params (so
// every combination of batched and shared operands takes its rule), with a
// static batch size and with a symbolic one. Then: per-example gradients
// (vmap of grad), axes, custom ops, compiled runs and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <set>

#include "rlx/autodiff/autodiff.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/models/demo_models.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/test_ops.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

using ir::Dim;
using ir::DType;
using ir::Graph;
using ir::NodeId;
using ir::OpKind;
using ir::Shape;
using ir::Tensor;
using reference::TensorMap;
using Ints = std::vector<std::int64_t>;

constexpr DType F = DType::F64;
constexpr std::int64_t kBatch = 3;

// Values for one input of the given shape.
using Gen = std::function<Tensor(const Ints& shape, std::mt19937_64& rng)>;

Gen uniform(double lo, double hi, DType t = F) {
  return [=](const Ints& s, std::mt19937_64& rng) { return testing::random_tensor(t, s, rng, lo, hi); };
}
Gen ints(std::int64_t lo, std::int64_t hi) {  // indices in [lo, hi]
  return [=](const Ints& s, std::mt19937_64& rng) {
    Tensor t(DType::I64, s);
    std::uniform_int_distribution<std::int64_t> u(lo, hi);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, double(u(rng)));
    return t;
  };
}
Gen bools() { return uniform(0, 1, DType::Bool); }

struct Case {
  std::string name;
  std::function<void(Graph&)> build;     // declares inputs/params and adds outputs
  std::map<std::string, Gen> gens = {};  // default: uniform(-2, 2) in the input's dtype
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

Gen gen_for(const Case& c, const ir::Node& n) {
  auto it = c.gens.find(n.attrs.get_str("name"));
  if (it != c.gens.end()) return it->second;
  if (n.dtype == DType::Bool) return bools();
  return uniform(-2, 2, n.dtype);
}

// Example i of a tensor batched along axis 0.
Tensor example(const Tensor& t, std::int64_t i) {
  Ints shape(t.shape().begin() + 1, t.shape().end());
  std::size_t bytes = t.nbytes() / std::size_t(t.shape()[0]);
  return Tensor(t.dtype(), shape, std::span<const std::byte>(t.data() + std::size_t(i) * bytes, bytes));
}

Tensor stack(const std::vector<Tensor>& parts) {
  Ints shape = parts[0].shape();
  shape.insert(shape.begin(), std::int64_t(parts.size()));
  std::vector<std::byte> bytes;
  for (const auto& p : parts) bytes.insert(bytes.end(), p.data(), p.data() + p.nbytes());
  return Tensor(parts[0].dtype(), shape, bytes);
}

std::vector<std::string> interface_names(const Graph& g) {
  std::vector<std::string> names;
  for (const auto& n : g.nodes())
    if (n.op == OpKind::Input || n.op == OpKind::Param) names.push_back(n.attrs.get_str("name"));
  return names;
}

// Runs `g` on every example and `vmap(g)` on the batch; they must agree.
void check_batched(const Case& c, const Graph& g, const std::vector<std::string>& batched, Dim size,
                   std::mt19937_64& rng) {
  std::string label = c.name + " batching {";
  for (const auto& b : batched) label += " " + b;
  label += " } size " + size.str();
  SCOPED_TRACE(label);
  Graph vg;
  try {
    vg = autodiff::vmap(g, {.batched = batched, .size = size});
  } catch (const Error& e) {
    // The only rule that cannot work with a symbolic batch merges it into a static dim.
    EXPECT_FALSE(size.is_static()) << e.what();
    EXPECT_NE(std::string(e.what()).find("needs a static batch size"), std::string::npos) << e.what();
    return;
  }
  vg.verify();
  ASSERT_EQ(interface_names(vg), interface_names(g));
  TensorMap inputs, params, batch_inputs, batch_params;
  for (const auto& n : g.nodes()) {
    if (n.op != OpKind::Input && n.op != OpKind::Param) continue;
    const auto& name = n.attrs.get_str("name");
    bool is_batched = std::find(batched.begin(), batched.end(), name) != batched.end();
    Ints shape = n.shape.extents();
    if (is_batched) shape.insert(shape.begin(), kBatch);
    (n.op == OpKind::Input ? batch_inputs : batch_params)[name] = gen_for(c, n)(shape, rng);
  }
  std::vector<std::vector<Tensor>> per_output(g.outputs().size());
  for (std::int64_t i = 0; i < kBatch; ++i) {
    TensorMap in, pa;
    for (const auto& [name, t] : batch_inputs)
      in[name] = std::find(batched.begin(), batched.end(), name) != batched.end() ? example(t, i) : t;
    for (const auto& [name, t] : batch_params)
      pa[name] = std::find(batched.begin(), batched.end(), name) != batched.end() ? example(t, i) : t;
    auto outs = reference::run(g, in, pa);
    for (std::size_t k = 0; k < outs.size(); ++k) per_output[k].push_back(outs[k]);
  }
  auto got = reference::run(vg, batch_inputs, batch_params);
  ASSERT_EQ(got.size(), per_output.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    Tensor want = stack(per_output[k]);
    EXPECT_TRUE(testing::tensors_close(got[k], want)) << "output " << k;
  }
}

// ---- the cases ------------------------------------------------------------------

NodeId in(Graph& g, const std::string& name, Shape s, DType t = F) { return g.input(name, std::move(s), t); }

std::vector<Case> elementwise_cases() {
  std::vector<Case> cases;
  for (OpKind op : ir::kAllOps) {
    auto cls = ir::op_info(op).cls;
    std::string name(ir::op_name(op));
    if (cls == ir::OpClass::Unary) {
      DType t = op == OpKind::Not ? DType::Bool : F;
      Case c{name, [op, t](Graph& g) { g.add_output(g.unary(op, in(g, "x", {2, 3}, t))); }};
      if (op == OpKind::Log || op == OpKind::Sqrt || op == OpKind::Rsqrt || op == OpKind::Reciprocal)
        c.gens["x"] = uniform(0.5, 2);
      cases.push_back(c);
    }
    if (cls == ir::OpClass::Binary) {
      DType t = op == OpKind::And || op == OpKind::Or ? DType::Bool : op == OpKind::Mod ? DType::I64 : F;
      // b broadcasts into a: batched, it needs 1-dims between the batch axis and its own.
      Case c{name, [op, t](Graph& g) { g.add_output(g.binary(op, in(g, "a", {2, 3}, t), in(g, "b", {3}, t))); }};
      if (op == OpKind::Pow) c.gens["a"] = uniform(0.5, 2);
      if (op == OpKind::Mod) c.gens = {{"a", uniform(-20, 20, DType::I64)}, {"b", uniform(1, 5, DType::I64)}};
      cases.push_back(c);
    }
  }
  cases.push_back({"where", [](Graph& g) {
                     g.add_output(g.where(in(g, "c", {2, 1}, DType::Bool), in(g, "a", {3}), in(g, "b", {2, 3})));
                   }});
  cases.push_back({"cast", [](Graph& g) { g.add_output(g.cast(in(g, "x", {2, 3}), DType::I32)); }});
  cases.push_back({"clamp", [](Graph& g) { g.add_output(g.clamp(in(g, "x", {4}), -1, 0.5)); }});
  return cases;
}

std::vector<Case> leaf_and_reduce_cases() {
  return {
      {"param_constant_iota",
       [](Graph& g) {
         NodeId x = in(g, "x", {2, 3});
         NodeId w = g.param("w", Shape{3}, F);
         NodeId c = g.constant(Tensor::from_f64(F, {3}, std::vector<double>{1, -2, 0.5}));
         g.add_output(g.mul(g.add(x, w), c));
         g.add_output(g.add(g.iota(Shape{2, 3}, 1, F), w));
         g.add_output(c);  // depends on nothing batched: broadcast
       }},
      {"random",
       [](Graph& g) {
         NodeId x = in(g, "x", {4});
         g.add_output(g.add(x, g.random_uniform(Shape{4}, 7, -1, 1, F)));
         g.add_output(g.mul(x, g.random_normal(Shape{4}, 8, 0, 1, F)));
       }},
      {"reduce_sum",
       [](Graph& g) {
         g.add_output(g.sum(in(g, "x", {2, 3, 4}), {1}));
       }},
      {"reduce_mean_keepdims",
       [](Graph& g) {
         g.add_output(g.mean(in(g, "x", {2, 3, 4}), {-1, 0}, true));
       }},
      {"reduce_max_min_prod",
       [](Graph& g) {
         NodeId x = in(g, "x", {3, 4});
         g.add_output(g.reduce(OpKind::ReduceMax, x, {0}));
         g.add_output(g.reduce(OpKind::ReduceMin, x, {1}, true));
         g.add_output(g.reduce(OpKind::ReduceProd, x, {0, 1}));
         g.add_output(g.sum(g.sum(x, {0, 1}), {}));  // rank 0, no axes
       }},
      {"argmax_argmin",
       [](Graph& g) {
         NodeId x = in(g, "x", {3, 4});
         g.add_output(g.argmax(x, 1));
         g.add_output(g.argmin(x, 0, true));
         g.add_output(g.argmax(g.sum(x, {0, 1}), 0));  // of a scalar: a row of one
       }},
      {"matmul",
       [](Graph& g) {
         g.add_output(g.matmul(in(g, "a", {2, 3}), in(g, "b", {3, 4})));
       }},
      {"matmul_batched_broadcast",
       [](Graph& g) {
         NodeId a = in(g, "a", {2, 3}), b = in(g, "b", {2, 3, 4});
         g.add_output(g.matmul(a, b));
         g.add_output(g.matmul(b, in(g, "c", {1, 4, 2})));
       }},
  };
}

std::vector<Case> movement_cases() {
  return {
      {"reshape_permute_expand",
       [](Graph& g) {
         NodeId x = in(g, "x", {2, 3, 4});
         g.add_output(g.reshape(x, Ints{6, 4}));
         g.add_output(g.permute(x, {2, 0, 1}));
         g.add_output(g.expand(in(g, "y", {3, 1}), Shape{2, 3, 4}));
       }},
      {"slice_pad_flip",
       [](Graph& g) {
         NodeId x = in(g, "x", {5, 7});
         g.add_output(g.slice(x, {0, 1}, {1, 0}, {5, 7}, {2, 3}));
         g.add_output(g.pad(x, {1, -2, 0, 3}, 0.5));
         g.add_output(g.flip(x, {1}));
       }},
      {"concat",
       [](Graph& g) {
         g.add_output(g.concat({in(g, "a", {2, 1}), in(g, "b", {2, 3}), in(g, "c", {2, 2})}, -1));
       }},
      {"squeeze_unsqueeze",
       [](Graph& g) {
         NodeId x = in(g, "x", {2, 1, 3});
         g.add_output(g.squeeze(x, {1}));
         g.add_output(g.unsqueeze(x, {0, -1}));
       }},
      {"gather",
       [](Graph& g) {
         g.add_output(g.gather(in(g, "x", {3, 4}), in(g, "i", {2, 4}, DType::I64), 0));
       },
       {{"i", ints(-3, 2)}}},
      {"index_select",
       [](Graph& g) {
         g.add_output(g.index_select(in(g, "x", {2, 4, 3}), in(g, "i", {2, 2}, DType::I64), 1));
       },
       {{"i", ints(-4, 3)}}},
      {"index_select_axis0",
       [](Graph& g) {
         g.add_output(g.index_select(in(g, "x", {5, 2}), in(g, "i", {3}, DType::I64), 0));
       },
       {{"i", ints(0, 4)}}},
      {"scatter_add",
       [](Graph& g) {
         g.add_output(g.scatter_add(in(g, "x", {3, 4}), in(g, "i", {2, 4}, DType::I64), in(g, "u", {2, 4}), 0));
       },
       {{"i", ints(0, 2)}}},
  };
}

std::vector<Case> composite_cases() {
  testing::register_test_ops();
  return {
      {"linear",
       [](Graph& g) {
         g.add_output(g.linear(in(g, "x", {2, 4}), in(g, "w", {4, 3}), in(g, "b", {3})));
       }},
      {"linear_vector_no_bias",
       [](Graph& g) {
         NodeId w = g.param("w", Shape{4, 3}, F);
         g.add_output(g.linear(in(g, "x", {4}), w));
       }},
      {"softmax_log_softmax",
       [](Graph& g) {
         NodeId x = in(g, "x", {3, 4});
         g.add_output(g.softmax(x, 0));
         g.add_output(g.log_softmax(x, -1));
         g.add_output(g.softmax(g.sum(x, {0, 1}), 0));  // a scalar
       }},
      {"layer_norm",
       [](Graph& g) {
         g.add_output(g.layer_norm(in(g, "x", {2, 3, 4}), in(g, "gamma", {3, 4}), in(g, "beta", {3, 4}), 1e-3, -2));
       }},
      {"layer_norm_plain",
       [](Graph& g) {
         g.add_output(g.layer_norm(in(g, "x", {3, 5}), std::nullopt, std::nullopt));
       }},
      {"rms_norm",
       [](Graph& g) {
         g.add_output(g.rms_norm(in(g, "x", {3, 4}), in(g, "gamma", {4}), 1e-6));
       }},
      {"group_norm",
       [](Graph& g) {
         g.add_output(g.group_norm(in(g, "x", {2, 4, 3}), 2, in(g, "gamma", {4}), in(g, "beta", {4})));
       }},
      {"conv1d",
       [](Graph& g) {
         g.add_output(g.conv1d(in(g, "x", {2, 4, 7}), in(g, "w", {6, 2, 3}), in(g, "b", {6}), 2, 1, 2, 2));
       }},
      {"conv2d",
       [](Graph& g) {
         g.add_output(g.conv2d(in(g, "x", {1, 3, 4, 4}), in(g, "w", {2, 3, 2, 2}), in(g, "b", {2}), {1, 1}, {1, 1}));
       }},
      {"pool2d",
       [](Graph& g) {
         NodeId x = in(g, "x", {1, 2, 5, 5});
         g.add_output(g.max_pool2d(x, {3, 3}, {2, 2}, {1, 1}));
         g.add_output(g.avg_pool2d(x, {2, 2}, {1, 2}));
       }},
      {"embedding",
       [](Graph& g) {
         g.add_output(g.embedding(in(g, "table", {5, 3}), in(g, "ids", {2, 3}, DType::I64)));
       },
       {{"ids", ints(0, 4)}}},
      {"rope",
       [](Graph& g) {
         g.add_output(g.rope(in(g, "x", {3, 2, 4}), in(g, "c", {3, 1, 2}), in(g, "s", {2})));
       }},
      {"rope_halves",
       [](Graph& g) {
         g.add_output(g.rope(in(g, "x", {2, 6}), in(g, "c", {3}), in(g, "s", {2, 3}), false));
       }},
      {"dynamic_update_slice",
       [](Graph& g) {
         g.add_output(g.dynamic_update_slice(in(g, "x", {3, 6}), in(g, "u", {3, 2}), in(g, "s", {}, DType::I64), 1));
       },
       {{"s", ints(-1, 6)}}},
      {"attention_grouped_kv_heads",
       [](Graph& g) {
         g.add_output(g.attention(in(g, "q", {1, 4, 3, 4}), in(g, "k", {1, 2, 5, 4}), in(g, "v", {1, 2, 5, 3})));
       }},
      {"attention",
       [](Graph& g) {
         g.add_output(g.attention(in(g, "q", {2, 2, 3, 4}), in(g, "k", {2, 2, 5, 4}), in(g, "v", {2, 2, 5, 3}),
                                  std::nullopt, false, 0.7));
       }},
      {"attention_causal_float_mask",
       [](Graph& g) {
         g.add_output(g.attention(in(g, "q", {1, 2, 3, 4}), in(g, "k", {1, 2, 3, 4}), in(g, "v", {1, 2, 3, 4}),
                                  in(g, "m", {3, 3}), true));
       }},
      {"attention_bool_mask_per_sequence",
       [](Graph& g) {
         g.add_output(g.attention(in(g, "q", {2, 1, 3, 4}), in(g, "k", {2, 1, 3, 4}), in(g, "v", {2, 1, 3, 4}),
                                  in(g, "m", {2, 1, 3, 3}, DType::Bool)));
       },
       // Key 0 is always visible, so no row is fully masked.
       {{"m",
         [](const Ints& s, std::mt19937_64& rng) {
           Tensor t = testing::random_tensor(DType::Bool, s, rng, 0, 1);
           for (std::int64_t i = 0; i < t.numel(); i += s.back()) t.set(i, 1);
           return t;
         }}}},
      {"backward_ops",
       [](Graph& g) {
         NodeId y = in(g, "y", {3, 4}), dy = in(g, "dy", {3, 4});
         g.add_output(g.add(OpKind::SoftmaxBackward, {y, dy}, {{"axis", std::int64_t(0)}}));
         g.add_output(g.add(OpKind::LogSoftmaxBackward, {y, dy}, {{"axis", std::int64_t(1)}}));
       }},
      {"norm_backward_ops",
       [](Graph& g) {
         NodeId x = in(g, "x", {2, 3, 4}), dy = in(g, "dy", {2, 3, 4});
         g.add_output(g.add(OpKind::LayerNormBackward, {x, dy, in(g, "gamma", {3, 4})},
                            {{"axis", std::int64_t(1)}, {"eps", 1e-5}}));
         g.add_output(g.add(OpKind::RmsNormBackward, {x, dy, in(g, "h", {4})}, {{"eps", 1e-6}}));
       }},
      {"custom_through_lowering",
       [](Graph& g) {
         g.add_output(g.custom_op("test_scaled_silu", {{"alpha", 1.5}}, {in(g, "x", {2, 3})}));
       }},
  };
}

std::vector<Case> control_flow_cases() {
  // (c, x, w) -> (tanh(c w + x), c x)
  auto cell = [] {
    Graph b("cell");
    NodeId c = in(b, "c", {4}), x = in(b, "x", {4}), w = in(b, "w", {4});
    b.set_outputs({b.unary(OpKind::Tanh, b.add(b.mul(c, w), x)), b.mul(c, x)});
    return ir::body_ref(std::move(b));
  };
  auto scan = [cell](bool reverse) {
    return [cell, reverse](Graph& g) {
      auto r = ir::scan(g, cell(), {in(g, "c0", {4})}, {in(g, "xs", {5, 4})}, -1, reverse, {in(g, "w", {4})});
      g.add_output(r[0], "final");
      g.add_output(r[1], "ys");
    };
  };
  auto unary_body = [](OpKind op) {
    Graph b(std::string(ir::op_name(op)));
    b.add_output(b.unary(op, in(b, "v", {3})));
    return ir::body_ref(std::move(b));
  };
  return {
      {"scan", scan(false)},
      {"scan_reverse", scan(true)},
      {"if",
       [unary_body](Graph& g) {
         NodeId v = in(g, "v", {3});
         g.add_output(
             ir::if_else(g, in(g, "flag", {}, DType::Bool), unary_body(OpKind::Exp), unary_body(OpKind::Neg), {v})[0]);
       }},
      {"if_on_a_computed_condition",
       [unary_body](Graph& g) {
         NodeId v = in(g, "v", {3});
         NodeId flag = g.binary(OpKind::Gt, g.sum(v, {0}), g.scalar(0, F));
         g.add_output(ir::if_else(g, flag, unary_body(OpKind::Sin), unary_body(OpKind::Cos), {v})[0]);
       }},
      {"while",  // v = v a + 0.5 while |v|^2 < 10, at most 6 times: a trip count per example
       [](Graph& g) {
         Graph cond("cond"), body("body");
         NodeId i = cond.input("i", {}, DType::I64), v = cond.input("v", {3}, F);
         cond.input("a", {3}, F);
         (void)i;
         cond.add_output(cond.binary(OpKind::Lt, cond.sum(cond.mul(v, v), {0}), cond.scalar(10, F)));
         NodeId bi = body.input("i", {}, DType::I64), bv = body.input("v", {3}, F), ba = body.input("a", {3}, F);
         body.set_outputs({body.add(bi, body.scalar(1, DType::I64)), body.add(body.mul(bv, ba), body.scalar(0.5, F))});
         auto r = ir::while_loop(g, ir::body_ref(std::move(cond)), ir::body_ref(std::move(body)),
                                 {g.scalar(0, DType::I64), in(g, "v0", {3})}, {in(g, "a", {3})}, 6);
         g.add_output(r[0], "trips");
         g.add_output(r[1], "v");
       },
       {{"v0", uniform(-1, 1)}, {"a", uniform(0.5, 2)}}},
  };
}

std::vector<Case> all_cases() {
  std::vector<Case> all;
  for (auto part :
       {elementwise_cases(), leaf_and_reduce_cases(), movement_cases(), composite_cases(), control_flow_cases()})
    all.insert(all.end(), part.begin(), part.end());
  return all;
}

class VmapOp : public ::testing::TestWithParam<Case> {};

// Every subset of the inputs and params batched, at a static and a symbolic size.
TEST_P(VmapOp, MatchesPerExampleRuns) {
  const Case& c = GetParam();
  Graph g(c.name);
  c.build(g);
  auto names = interface_names(g);
  ASSERT_LE(names.size(), 4u);
  std::mt19937_64 rng(testing::test_seed() ^ std::hash<std::string>{}(c.name));
  for (std::size_t mask = 1; mask < (std::size_t{1} << names.size()); ++mask) {
    std::vector<std::string> batched;
    for (std::size_t i = 0; i < names.size(); ++i)
      if (mask >> i & 1) batched.push_back(names[i]);
    check_batched(c, g, batched, Dim(kBatch), rng);
    check_batched(c, g, batched, Dim::symbol("batch"), rng);
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, VmapOp, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// A new op fails here until it has a case above (and so a batching rule).
TEST(Vmap, EveryOpHasACase) {
  std::set<OpKind> covered;
  for (const auto& c : all_cases()) {
    Graph g(c.name);
    c.build(g);
    for (const auto& n : g.nodes()) covered.insert(n.op);
  }
  // The block-quantized ops batch by applying themselves to the batched operand (blocks run along the last axis);
  // tests/conformance checks them at every rank they take.
  for (OpKind op : ir::kAllOps)
    if (op != OpKind::QuantizedMatmul && ir::op_info(op).cls != ir::OpClass::Quant)
      EXPECT_TRUE(covered.contains(op)) << ir::op_name(op) << " has no vmap case";
}

// ---- beyond single ops ----------------------------------------------------------

TensorMap run_map(const Graph& g, const TensorMap& in, const TensorMap& pa = {}) {
  TensorMap out;
  auto r = reference::run(g, in, pa);
  for (std::size_t i = 0; i < r.size(); ++i) out[g.outputs()[i].name] = r[i];
  return out;
}

// An MLP's loss on one example; vmap of its gradient gives per-example gradients.
Graph one_example_loss() {
  Graph g("mlp_loss");
  NodeId x = in(g, "x", {5}), t = in(g, "t", {3});
  NodeId w1 = g.param("w1", Shape{5, 8}, F), b1 = g.param("b1", Shape{8}, F), w2 = g.param("w2", Shape{8, 3}, F);
  NodeId h = g.unary(OpKind::Tanh, g.linear(x, w1, b1));
  NodeId logp = g.log_softmax(g.linear(h, w2), -1);
  g.add_output(g.mul(g.sum(g.mul(logp, t), {0}), g.scalar(-1, F)), "loss");
  return g;
}

TEST(Vmap, PerExampleGradients) {
  Graph g = one_example_loss();
  Graph grads = autodiff::grad(g, {"w1", "b1", "w2", "x"});
  Graph per_example = autodiff::vmap(grads, {.batched = {"x", "t"}, .size = Dim(4)});
  std::mt19937_64 rng(testing::test_seed());
  TensorMap params{{"w1", testing::random_tensor(F, {5, 8}, rng, -1, 1)},
                   {"b1", testing::random_tensor(F, {8}, rng, -1, 1)},
                   {"w2", testing::random_tensor(F, {8, 3}, rng, -1, 1)}};
  TensorMap batch{{"x", testing::random_tensor(F, {4, 5}, rng)}, {"t", testing::random_tensor(F, {4, 3}, rng, 0, 1)}};
  auto got = run_map(per_example, batch, params);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got.at("grad_w1").shape(), (Ints{4, 5, 8}));
  for (std::int64_t i = 0; i < 4; ++i) {
    auto want = run_map(grads, {{"x", example(batch.at("x"), i)}, {"t", example(batch.at("t"), i)}}, params);
    for (const auto& [name, t] : want) EXPECT_TRUE(testing::tensors_close(example(got.at(name), i), t)) << name << i;
  }
}

TEST(Vmap, InAndOutAxes) {
  Graph g("axes");
  NodeId x = in(g, "x", {2, 3});
  g.add_output(g.sum(g.mul(x, x), {1}), "s");
  g.add_output(g.transpose(x), "t");
  Graph vg = autodiff::vmap(g, {.size = Dim(4), .in_axis = 1, .out_axis = -1});
  EXPECT_EQ(vg.node(vg.input_ids()[0]).shape, (Shape{2, 4, 3}));
  std::mt19937_64 rng(testing::test_seed());
  Tensor xb = testing::random_tensor(F, {2, 4, 3}, rng);
  auto got = reference::run(vg, {{"x", xb}});
  ASSERT_EQ(got[0].shape(), (Ints{2, 4}));
  ASSERT_EQ(got[1].shape(), (Ints{3, 2, 4}));
  for (std::int64_t b = 0; b < 4; ++b) {
    Tensor xi(F, {2, 3});
    for (std::int64_t r = 0; r < 2; ++r)
      for (std::int64_t c = 0; c < 3; ++c) xi.set(r * 3 + c, xb.get((r * 4 + b) * 3 + c));
    auto want = reference::run(g, {{"x", xi}});
    for (std::int64_t r = 0; r < 2; ++r) EXPECT_DOUBLE_EQ(got[0].get(r * 4 + b), want[0].get(r));
    for (std::int64_t i = 0; i < 6; ++i) EXPECT_DOUBLE_EQ(got[1].get(i * 4 + b), want[1].get(i));
  }
}

// A custom op whose own batching rule vmap must use instead of its lowering.
class Doubler final : public ir::OpExtension {
 public:
  mutable int vmap_calls = 0;
  std::string_view name() const override { return "test_vmap_doubler"; }
  int num_inputs() const override { return 1; }
  ir::TypeInfo infer(std::span<const ir::TypeInfo> in, const ir::Attrs&) const override { return in[0]; }
  std::optional<NodeId> lower(Graph& g, std::span<const NodeId> in, const ir::Attrs&) const override {
    return g.add(in[0], in[0]);
  }
  std::optional<NodeId> vmap(Graph& g, std::span<const NodeId> in, std::span<const std::int64_t> axes,
                             const ir::Attrs&) const override {
    ++vmap_calls;
    if (axes[0] != 0) throw Error("test_vmap_doubler: expected a batched input");
    return g.mul(in[0], g.scalar(2, g.node(in[0]).dtype));
  }
};

TEST(Vmap, CustomOpUsesItsBatchingRule) {
  auto ext = std::make_shared<Doubler>();
  ir::register_op(ext);
  Graph g("custom");
  g.add_output(g.custom_op("test_vmap_doubler", {}, {in(g, "x", {3})}));
  Graph vg = autodiff::vmap(g, {.size = Dim(2)});
  EXPECT_EQ(ext->vmap_calls, 1);
  EXPECT_TRUE(
      std::none_of(vg.nodes().begin(), vg.nodes().end(), [](const ir::Node& n) { return n.op == OpKind::Custom; }));
  Tensor x = Tensor::from_f64(F, {2, 3}, std::vector<double>{1, 2, 3, 4, 5, 6});
  EXPECT_TRUE(testing::tensors_close(reference::run(vg, {{"x", x}})[0],
                                     Tensor::from_f64(F, {2, 3}, std::vector<double>{2, 4, 6, 8, 10, 12})));
}

using rlx::testing::expect_error;

TEST(Vmap, NoRuleIsAnErrorNamingTheOp) {
  testing::register_test_ops();
  Graph g("host_only");
  NodeId x = g.input("x", {3}, DType::F32);
  g.add_output(g.custom_op("test_host_cube", {}, {g.add(x, x)}));
  expect_error([&] { autodiff::vmap(g, {.size = Dim(2)}); }, {"test_host_cube", "no vmap rule", "%2"});
  // Shared operands still pass through it: only batched ones need a rule.
  Graph h("shared");
  NodeId p = h.param("p", Shape{3}, DType::F32);
  h.add_output(h.mul(h.custom_op("test_host_cube", {}, {p}), h.input("x", {3}, DType::F32)));
  EXPECT_NO_THROW(autodiff::vmap(h, {.size = Dim(2)}).verify());
}

TEST(Vmap, BadRequestsAreErrors) {
  Graph g("bad");
  NodeId x = in(g, "x", {2, 3});
  g.add_output(g.sum(x, {0}));
  expect_error([&] { autodiff::vmap(g, {.batched = {"nope"}}); }, {"'nope'", "x"});
  expect_error([&] { autodiff::vmap(g, {.size = Dim(2), .in_axis = 3}); }, {"in_axis", "out of range"});
  expect_error([&] { autodiff::vmap(g, {.size = Dim(2), .out_axis = -3}); }, {"out_axis"});
  expect_error([&] { autodiff::vmap(g, {.size = Dim(-2)}); }, {"batch size"});
  // index_select with batched table and indices needs the batch size.
  Graph h("select");
  h.add_output(h.index_select(in(h, "t", {4, 2}), in(h, "i", {3}, DType::I64), 0));
  expect_error([&] { autodiff::vmap(h); }, {"index_select", "static batch size"});
}

// A vmapped graph compiles like any other: per-example gradients of an MLP
// and a batched attention, on the CPU against the reference.
TEST(VmapCompiled, CpuMatchesReference) {
  Graph g = one_example_loss();
  Graph grads = autodiff::vmap(autodiff::value_and_grad(g, {"w1", "w2"}), {.batched = {"x", "t"}, .size = Dim(6)});
  Graph att("att");
  att.add_output(att.attention(in(att, "q", {1, 2, 4, 8}), in(att, "k", {1, 2, 4, 8}), in(att, "v", {1, 2, 4, 8}),
                               std::nullopt, true));
  Graph vatt = autodiff::vmap(att, {.size = Dim(3)});
  for (Graph* vg : {&grads, &vatt}) {
    SCOPED_TRACE(vg->name());
    std::mt19937_64 rng(testing::test_seed());
    TensorMap inputs, params;
    for (const auto& n : vg->nodes()) {
      if (n.op != OpKind::Input && n.op != OpKind::Param) continue;
      (n.op == OpKind::Input ? inputs : params)[n.attrs.get_str("name")] =
          testing::random_tensor(F, n.shape.extents(), rng, n.attrs.get_str("name") == "t" ? 0 : -1, 1);
    }
    auto compiled = runtime::Session().compile(*vg);
    for (const auto& [k, v] : params) compiled.set_param(k, v);
    auto got = compiled.run(inputs);
    auto want = reference::run(*vg, inputs, params);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(testing::tensors_close(got[i], want[i], {1e-9, 1e-9}));
  }
}

}  // namespace
}  // namespace rlx
