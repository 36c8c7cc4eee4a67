#pragma once
// Test-only LIR machinery shared by the lowering, memory and pipeline tests:
// a contract checker (rlx/compile/lir.hpp and the LIR kernel contract) and an
// executor that runs every kernel body with the reference interpreter over
// one poisoned byte arena laid out by the memory plan. If the plan lets two
// live buffers overlap, or a kernel reads a buffer nobody wrote, results
// differ from the reference on the source graph.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "rlx/compile/pipeline.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/reference/interpreter.hpp"
#include "support/testing.hpp"

namespace rlx::testing {

// A BackendTraits claiming every primitive plus the given composites.
inline compile::BackendTraits all_primitives(std::set<ir::OpKind> composites = {}) {
  compile::BackendTraits t;
  for (auto op : ir::kAllOps)
    if (ir::op_info(op).cls != ir::OpClass::Composite) t.native_ops.insert(op);
  t.native_ops.insert(composites.begin(), composites.end());
  return t;
}

inline bool broadcastable_to(const ir::Shape& s, const ir::Shape& target) {
  if (s.rank() > target.rank()) return false;
  auto off = target.rank() - s.rank();
  for (std::size_t i = 0; i < s.rank(); ++i)
    if (s[i].size != 1 && s[i] != target[off + i]) return false;
  return true;
}

// Checks the structural LIR contract, with the MatMul extensions `traits`
// accepts (BackendTraits::matmul_*); failures name the kernel.
inline ::testing::AssertionResult check_contract(const compile::LirModule& m,
                                                 const compile::BackendTraits& traits = {}) {
  using compile::KernelKind;
  auto fail = [&](const compile::Kernel& k, const std::string& why) {
    return ::testing::AssertionFailure() << k.name << ": " << why << "\n" << ir::to_text(k.body);
  };
  for (const auto& b : m.buffers) {
    const auto& root = m.buffer(b.root);
    if (root.root != root.id) return ::testing::AssertionFailure() << "b" << b.id << ": root is itself a view";
    if (b.root != b.id && (b.view_offset < 0 || b.view_offset + b.nbytes() > root.nbytes()))
      return ::testing::AssertionFailure() << "b" << b.id << ": view outside its root";
  }
  for (const auto& k : m.kernels) {
    const auto& body = k.body;
    std::vector<ir::NodeId> ops;
    std::size_t n_in = 0;
    for (const auto& n : body.nodes()) {
      if (n.op == ir::OpKind::Input) {
        if (n_in >= k.inputs.size()) return fail(k, "more body inputs than kernel inputs");
        const auto& b = m.buffer(k.inputs[n_in]);
        if (n.attrs.get_str("name") != "in" + std::to_string(n_in) || n.dtype != b.dtype ||
            n.shape != ir::Shape(b.shape))
          return fail(k, "body input " + std::to_string(n_in) + " does not match its buffer");
        ++n_in;
      } else if (n.op != ir::OpKind::Constant) {
        ops.push_back(n.id);
      }
    }
    if (n_in != k.inputs.size()) return fail(k, "fewer body inputs than kernel inputs");
    if (body.outputs().size() != k.outputs.size()) return fail(k, "output count");
    for (std::size_t j = 0; j < k.outputs.size(); ++j) {
      const auto& n = body.node(body.outputs()[j].node);
      const auto& b = m.buffer(k.outputs[j]);
      if (n.dtype != b.dtype || n.shape != ir::Shape(b.shape)) return fail(k, "body output does not match buffer");
      if (b.root != b.id || b.role != compile::BufferRole::Arena) return fail(k, "output is not an arena root");
      if (std::find(k.inputs.begin(), k.inputs.end(), k.outputs[j]) != k.inputs.end())
        return fail(k, "output aliases an input");
    }
    if (ops.empty()) return fail(k, "no op");
    auto ew = [&](ir::NodeId id) { return ir::is_elementwise(body.node(id).op); };
    switch (k.kind) {
      case KernelKind::Elementwise: {
        const auto& iter = body.node(body.outputs()[0].node).shape;
        for (const auto& o : body.outputs())
          if (body.node(o.node).shape != iter) return fail(k, "outputs differ in shape");
        for (const auto& n : body.nodes())
          if (!broadcastable_to(n.shape, iter)) return fail(k, "node not broadcastable to the iteration shape");
        for (auto id : ops)
          if (!ew(id)) return fail(k, "non-elementwise op");
        break;
      }
      case KernelKind::Reduce:
      case KernelKind::MatMul: {
        auto cls = k.kind == KernelKind::Reduce ? ir::OpClass::Reduce : ir::OpClass::MatMul;
        auto it =
            std::find_if(ops.begin(), ops.end(), [&](auto id) { return ir::op_info(body.node(id).op).cls == cls; });
        if (it == ops.end()) return fail(k, "no anchor op");
        const auto& anchor = body.node(*it);
        const bool matmul = k.kind == KernelKind::MatMul;
        // A transposed B: permute(Input) swapping the last two dims, read only by the matmul.
        auto transposed_b = [&](ir::NodeId id) {
          const auto& n = body.node(id);
          if (!matmul || !traits.matmul_transposed_b || n.op != ir::OpKind::Permute || anchor.inputs[1] != id ||
              anchor.inputs[0] == id || body.node(n.inputs[0]).op != ir::OpKind::Input)
            return false;
          auto perm = n.attrs.get_ints("perm");
          const auto r = perm.size();
          std::swap(perm[r - 1], perm[r - 2]);
          for (std::size_t i = 0; i < r; ++i)
            if (perm[i] != std::int64_t(i)) return false;
          return true;
        };
        if (k.outputs.size() != 1 && !(matmul && traits.matmul_multi_output_epilogue))
          return fail(k, "several outputs");
        for (auto p = ops.begin(); p != ops.end(); ++p) {
          if (p == it || (p < it && transposed_b(*p))) continue;
          if (!ew(*p)) return fail(k, "second non-elementwise op");
          const auto& target = p < it ? body.node(anchor.inputs[0]).shape : anchor.shape;
          if (p < it && matmul) return fail(k, "matmul prologue");
          if (!broadcastable_to(body.node(*p).shape, target)) return fail(k, "prologue/epilogue shape");
          if (p > it)
            for (auto in : body.node(*p).inputs)
              if (std::find(ops.begin(), it, in) != it) return fail(k, "epilogue reads a prologue node");
        }
        if (matmul)
          for (auto in : anchor.inputs)
            if (body.node(in).op != ir::OpKind::Input && !transposed_b(in))
              return fail(k, "matmul operand is not a body input");
        break;
      }
      case KernelKind::ControlFlow:  // the sibling nodes of one control-flow op, one per result it writes
        for (auto id : ops)
          if (!ir::are_siblings(body.node(ops[0]), body.node(id))) return fail(k, "nodes of several control-flow ops");
        break;
      default:
        if (ops.size() != 1) return fail(k, "movement/native/leaf kernels hold one op");
        break;
    }
  }
  return ::testing::AssertionSuccess();
}

// Runs a planned module. Inputs/params are keyed by name.
inline std::vector<ir::Tensor> run_lir(const compile::LirModule& m, const reference::TensorMap& inputs,
                                       const reference::TensorMap& params = {}) {
  using compile::BufferRole;
  std::vector<std::byte> arena(std::size_t(m.memory.arena_bytes), std::byte{0xff});  // NaN / -1 poison
  std::vector<std::byte*> base(m.buffers.size(), nullptr);
  std::vector<ir::Tensor> owned;
  owned.reserve(m.buffers.size());
  for (const auto& b : m.buffers) {
    if (b.root != b.id) continue;
    const ir::Tensor* src = nullptr;
    if (b.role == BufferRole::Input)
      src = &inputs.at(b.name);
    else if (b.role == BufferRole::Param)
      src = &params.at(b.name);
    else if (b.role == BufferRole::Constant)
      src = &m.constant_values.at(std::size_t(b.external_index));
    if (src) {
      EXPECT_EQ(src->nbytes(), std::size_t(b.nbytes())) << b.name;
      owned.push_back(*src);
      base[std::size_t(b.id)] = owned.back().data();
    } else {
      EXPECT_GE(b.arena_offset, 0) << "b" << b.id;
      EXPECT_LE(b.arena_offset + b.nbytes(), m.memory.arena_bytes) << "b" << b.id;
      base[std::size_t(b.id)] = arena.data() + b.arena_offset;
    }
  }
  auto ptr = [&](compile::BufferId id) { return base[std::size_t(m.buffer(id).root)] + m.buffer(id).view_offset; };
  auto read = [&](compile::BufferId id) {
    const auto& b = m.buffer(id);
    return ir::Tensor(b.dtype, b.shape, {ptr(id), std::size_t(b.nbytes())});
  };
  for (const auto& k : m.kernels) {
    reference::TensorMap ins;
    for (std::size_t i = 0; i < k.inputs.size(); ++i) ins["in" + std::to_string(i)] = read(k.inputs[i]);
    auto outs = reference::run(k.body, ins);
    for (std::size_t j = 0; j < k.outputs.size(); ++j) {
      EXPECT_EQ(outs[j].nbytes(), std::size_t(m.buffer(k.outputs[j]).nbytes())) << k.name;
      // A zero-size output has no data pointer, and memcpy's pointers must be valid even for 0 bytes.
      if (const auto n = std::min<std::size_t>(outs[j].nbytes(), m.buffer(k.outputs[j]).nbytes()); n != 0)
        std::memcpy(ptr(k.outputs[j]), outs[j].data(), n);
    }
  }
  std::vector<ir::Tensor> result;
  for (auto id : m.outputs) result.push_back(read(id));
  return result;
}

// Random inputs and params for every Input/Param of `g`.
inline std::pair<reference::TensorMap, reference::TensorMap> random_feeds(const ir::Graph& g, std::mt19937_64& rng) {
  reference::TensorMap in, params;
  for (const auto& n : g.nodes()) {
    if (n.op != ir::OpKind::Input && n.op != ir::OpKind::Param) continue;
    (n.op == ir::OpKind::Input ? in : params)[n.attrs.get_str("name")] = random_tensor(n.dtype, n.shape.extents(), rng);
  }
  return {in, params};
}

// Random static MIR graphs: elementwise chains and DAGs with broadcasting,
// reductions (keepdims or not), rank-2 matmuls, reshapes, slices (contiguous
// or strided), permutes and concats, several outputs and shared producers.
inline ir::Graph random_mir(std::mt19937_64& rng, int ops = 24) {
  using ir::OpKind;
  ir::Graph g("random");
  auto pick = [&](std::size_t n) { return std::size_t(rng() % n); };
  std::vector<ir::NodeId> pool{g.input("x", ir::Shape{4, 6}), g.input("y", ir::Shape{4, 6}),
                               g.param("w", ir::Shape{6, 5}), g.input("v", ir::Shape{6}),
                               g.input("c", ir::Shape{4, 1})};
  const OpKind unary[] = {OpKind::Tanh, OpKind::Relu, OpKind::Neg, OpKind::Sigmoid, OpKind::Abs, OpKind::Sin};
  const OpKind binary[] = {OpKind::Add, OpKind::Mul, OpKind::Sub, OpKind::Max};
  for (int i = 0; i < ops; ++i) {
    // Recent nodes are picked more often, which makes chains; older ones make fan-out.
    auto recent = [&] { return pool[pool.size() - 1 - std::min(pick(4), pool.size() - 1)]; };
    ir::NodeId a = recent(), b = pool[pick(pool.size())];
    const auto& sa = g.node(a).shape;
    try {
      switch (pick(10)) {
        case 0:
        case 1:
        case 2: pool.push_back(g.unary(unary[pick(6)], a)); break;
        case 3:
        case 4:
          ir::broadcast_shapes(sa, g.node(b).shape);
          pool.push_back(g.binary(binary[pick(4)], a, b));
          break;
        case 5:
          if (sa.rank() == 0) continue;
          pool.push_back(g.reduce(pick(2) ? OpKind::ReduceSum : OpKind::ReduceMax, a, {std::int64_t(pick(sa.rank()))},
                                  pick(2) == 0));
          break;
        case 6:
          if (sa.rank() != 2) continue;
          pool.push_back(g.matmul(a, g.param("m" + std::to_string(i), ir::Shape{sa[1].size, 3})));
          break;
        case 7: pool.push_back(g.reshape(a, std::vector<std::int64_t>{-1})); break;
        case 8: {
          if (sa.rank() == 0 || sa[0].size < 2) continue;
          auto axis = std::int64_t(pick(sa.rank()));
          auto d = sa[std::size_t(axis)].size;
          pool.push_back(g.slice(a, {axis}, {1}, {d}, {std::int64_t(1 + pick(2))}));
          break;
        }
        default:
          if (sa.rank() == 2)
            pool.push_back(g.transpose(a));
          else
            pool.push_back(g.concat({a, a}, 0));
          break;
      }
    } catch (const Error&) {
    }
  }
  g.add_output(pool.back(), "last");
  for (int i = 0; i < 2 && pool.size() > 5; ++i) g.add_output(pool[5 + pick(pool.size() - 5)]);
  return g;
}

}  // namespace rlx::testing
