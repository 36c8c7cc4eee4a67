// Leaves: the node's own dtype and shape are declared.
#include "ops/family.hpp"
#include "rlx/ir/random.hpp"

namespace rlx::ops {
namespace {

ir::TypeInfo declared_leaf(const ir::InferArgs& a) {
  const ir::TypeInfo& d = a.need_declared();
  for (const auto& dim : d.shape.dims()) a.require(!dim.is_static() || dim.size >= 0, "negative extent");
  return d;
}

F64Value constant_reference(const ReferenceArgs& c) {
  if (!c.n.value) c.fail("constant has no value");
  F64Value r = c.result(c.n.value->shape());
  r.v = c.n.value->to_f64();
  return r;
}

F64Value iota_reference(const ReferenceArgs& c) {
  F64Value r = c.result(c.declared());
  if (r.rank() == 0) return r;  // a scalar sits at index 0
  const auto axis = std::size_t(c.axis(c.attrs().get_int("axis"), r.rank()));
  for_each_index(r.ext, [&](const Extents& idx, std::int64_t flat) { r.v[std::size_t(flat)] = double(idx[axis]); });
  return r;
}

// Counter-based: element i of seed s is the same value on every backend.
F64Value uniform_reference(const ReferenceArgs& c) {
  F64Value r = c.result(c.declared());
  const auto seed = std::uint64_t(c.attrs().get_int("seed"));
  const double lo = c.attrs().get_float("low"), hi = c.attrs().get_float("high");
  for (std::size_t i = 0; i < r.v.size(); ++i) r.v[i] = lo + (hi - lo) * double(ir::rng_uniform01(seed, i));
  return r;
}

F64Value normal_reference(const ReferenceArgs& c) {
  F64Value r = c.result(c.declared());
  const auto seed = std::uint64_t(c.attrs().get_int("seed"));
  const double mean = c.attrs().get_float("mean"), sd = c.attrs().get_float("std");
  for (std::size_t i = 0; i < r.v.size(); ++i) r.v[i] = mean + sd * ir::rng_normal(seed, i);
  return r;
}

}  // namespace
}  // namespace rlx::ops

RLX_OP_FAMILY(leaf) {
  using namespace rlx::ops;
  using rlx::ir::define_op;
  using rlx::ir::InferArgs;
  using rlx::ir::TypeInfo;
  auto random = [](const InferArgs& a) {
    TypeInfo d = declared_leaf(a);
    a.require(rlx::ir::is_float(d.dtype), "needs a float dtype");
    return d;
  };
  define_op({.kind = OpKind::Input,
             .doc = "a run-time input, fed by name",
             .attrs = {{"name", T::String, true}},
             .infer = declared_leaf,
             .flops_per_element = 0});
  define_op({.kind = OpKind::Param,
             .doc = "a parameter held by the session",
             .attrs = {{"name", T::String, true}},
             .infer = declared_leaf,
             .flops_per_element = 0});
  define_op({.kind = OpKind::Constant,
             .doc = "a tensor held in the node",
             .infer = declared_leaf,
             .reference = constant_reference,
             .flops_per_element = 0});
  define_op({.kind = OpKind::Iota,
             .doc = "the index along `axis`",
             .attrs = {{"axis", T::Int, true}},
             .infer =
                 [](const InferArgs& a) {
                   TypeInfo d = declared_leaf(a);
                   rlx::ir::normalize_axis(a.attrs.get_int("axis"), d.shape.rank());
                   return d;
                 },
             .reference = iota_reference,
             .flops_per_element = 0});
  define_op({.kind = OpKind::RandomUniform,
             .doc = "counter-based uniform samples in [low, high)",
             .attrs = {{"seed", T::Int, true}, {"low", T::Float, true}, {"high", T::Float, true}},
             .infer = random,
             .reference = uniform_reference});
  define_op({.kind = OpKind::RandomNormal,
             .doc = "counter-based normal samples",
             .attrs = {{"seed", T::Int, true}, {"mean", T::Float, true}, {"std", T::Float, true}},
             .infer = random,
             .reference = normal_reference});
}
