// Shape and dtype inference: an op's own rule from the op table (rlx/ir/op_def.hpp),
// else the rule of its class below.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <string>

#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/ir/graph.hpp"
#include "rlx/ir/limits.hpp"
#include "rlx/ir/op_def.hpp"

namespace rlx::ir {

namespace {

[[noreturn]] void fail(const Graph& g, OpKind op, std::span<const NodeId> inputs, const std::string& what) {
  std::string s = std::string(op_name(op)) + " with inputs (";
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (i) s += ", ";
    if (i == limits::kMaxListedItems && inputs.size() > limits::kMaxListedItems + 1) {
      s += "... and " + std::to_string(inputs.size() - i) + " more";
      break;
    }
    if (inputs[i] < g.size()) {
      const Node& n = g.nodes()[inputs[i]];
      s += "%" + std::to_string(n.id) + ": " + std::string(dtype_name(n.dtype)) + n.shape.str();
    } else {
      s += "%" + std::to_string(inputs[i]) + ": <undefined>";
    }
  }
  throw Error(s + "): " + what);
}

bool is_one(const Dim& d) { return d.is_static() && d.size == 1; }

}  // namespace

namespace {

TypeInfo infer_unchecked(const Graph& g, OpKind op, std::span<const NodeId> inputs, const Attrs& attrs,
                         const TypeInfo* declared) {
  const OpInfo& info = op_info(op);
  auto n_in = static_cast<int>(inputs.size());
  if (n_in < info.min_inputs || n_in > info.max_inputs)
    fail(g, op, inputs,
         "expects " +
             (info.min_inputs == info.max_inputs
                  ? std::to_string(info.min_inputs)
                  : std::to_string(info.min_inputs) + " to " + std::to_string(info.max_inputs)) +
             " inputs, got " + std::to_string(n_in));
  for (auto id : inputs)
    if (id >= g.size()) fail(g, op, inputs, "input %" + std::to_string(id) + " does not exist");
  auto in = [&](int i) -> const Node& { return g.nodes()[inputs[static_cast<std::size_t>(i)]]; };
  auto require = [&](bool ok, const std::string& what) {
    if (!ok) fail(g, op, inputs, what);
  };
  auto need_declared = [&]() -> const TypeInfo& {
    require(declared != nullptr, "needs a declared dtype and shape");
    return *declared;
  };
  try {
    for (const auto& spec : op_attr_schema(op))
      if (spec.required && !attrs.has(spec.key)) require(false, "missing attribute '" + std::string(spec.key) + "'");

    if (info.cls == OpClass::Custom) {
      auto ext = find_op_extension(attrs.get_str("op"));
      for (const auto& spec : ext->attr_schema())
        if (spec.required && !attrs.has(spec.key)) require(false, "missing attribute '" + std::string(spec.key) + "'");
      if (ext->num_inputs() >= 0)
        require(n_in == ext->num_inputs(), "custom op '" + std::string(ext->name()) + "' takes " +
                                               std::to_string(ext->num_inputs()) + " inputs, got " +
                                               std::to_string(n_in));
      std::vector<TypeInfo> ins;
      for (int i = 0; i < n_in; ++i) ins.push_back({in(i).dtype, in(i).shape});
      return ext->infer(ins, attrs);
    }
    if (info.cls == OpClass::ControlFlow) return infer_control_flow(g, op, inputs, attrs);
    if (const auto& rule = op_def(op).infer) {
      std::vector<TypeInfo> ins;
      for (int i = 0; i < n_in; ++i) ins.push_back({in(i).dtype, in(i).shape});
      return rule(InferArgs{ins, attrs});
    }

    switch (info.cls) {
      case OpClass::Unary:
      case OpClass::Binary:
      case OpClass::Elementwise: break;  // every one has its rule in the op table (src/ops/unary.cpp, binary.cpp)
      case OpClass::Leaf: {
        const TypeInfo& d = need_declared();
        for (const auto& dim : d.shape.dims()) require(!dim.is_static() || dim.size >= 0, "negative extent");
        if (op == OpKind::Iota) normalize_axis(attrs.get_int("axis"), d.shape.rank());
        if (op == OpKind::RandomUniform || op == OpKind::RandomNormal)
          require(is_float(d.dtype), "needs a float dtype");
        return d;
      }
      case OpClass::Reduce: {
        const Shape& s = in(0).shape;
        DType t = in(0).dtype;
        require(t != DType::Bool, "does not take bool (cast first)");
        std::vector<bool> reduced(s.rank(), false);
        bool keep = attrs.get_bool("keepdims");
        if (op == OpKind::ArgMax || op == OpKind::ArgMin) {
          auto ax = static_cast<std::size_t>(normalize_axis(attrs.get_int("axis"), s.rank()));
          if (s.rank() > 0) reduced[ax] = true;
          t = DType::I64;
        } else {
          if (op == OpKind::ReduceMean) require(is_float(t), "needs a float input");
          for (auto a : attrs.get_ints("axes")) {
            auto ax = static_cast<std::size_t>(normalize_axis(a, s.rank()));
            require(s.rank() > 0 && !reduced[ax], "axis " + std::to_string(a) + " is repeated or invalid");
            reduced[ax] = true;
          }
        }
        std::vector<Dim> out;
        for (std::size_t i = 0; i < s.rank(); ++i) {
          if (!reduced[i])
            out.push_back(s[i]);
          else if (keep)
            out.emplace_back(1);
        }
        return {t, Shape(std::move(out))};
      }
      case OpClass::MatMul: {
        const Shape &a = in(0).shape, &b = in(1).shape;
        require(in(0).dtype == in(1).dtype, "operand dtypes differ");
        require(in(0).dtype != DType::Bool, "does not take bool");
        require(a.rank() >= 2 && b.rank() >= 2, "operands need rank >= 2");
        require(a[a.rank() - 1] == b[b.rank() - 2],
                "contraction dims differ (" + a[a.rank() - 1].str() + " vs " + b[b.rank() - 2].str() + ")");
        Shape ba(std::vector<Dim>(a.dims().begin(), a.dims().end() - 2));
        Shape bb(std::vector<Dim>(b.dims().begin(), b.dims().end() - 2));
        Shape batch = broadcast_shapes(ba, bb);
        auto dims = batch.dims();
        dims.push_back(a[a.rank() - 2]);
        dims.push_back(b[b.rank() - 1]);
        return {in(0).dtype, Shape(std::move(dims))};
      }
      case OpClass::Movement:
      case OpClass::Composite:
      case OpClass::Custom:
      case OpClass::ControlFlow: break;
    }

    const Shape& s0 = in(0).shape;
    DType t0 = in(0).dtype;
    auto rank = s0.rank();
    switch (op) {
      case OpKind::Concat:
      case OpKind::Gather:
      case OpKind::ScatterAdd:
      case OpKind::Squeeze:
      case OpKind::Flip: require(rank > 0, "needs an input of rank >= 1"); break;
      default: break;
    }
    switch (op) {
      case OpKind::Reshape: {
        const TypeInfo& d = need_declared();
        require(d.dtype == t0, "cannot change the dtype");
        if (s0.is_static() && d.shape.is_static())
          require(s0.numel() == d.shape.numel(), "element count changes to " + d.shape.str());
        return d;
      }
      case OpKind::Expand: {
        const TypeInfo& d = need_declared();
        require(d.dtype == t0, "cannot change the dtype");
        require(broadcast_shapes(s0, d.shape) == d.shape, "cannot expand to " + d.shape.str());
        return d;
      }
      case OpKind::Permute: {
        const auto& perm = attrs.get_ints("perm");
        require(perm.size() == rank,
                "perm has " + std::to_string(perm.size()) + " entries for rank " + std::to_string(rank));
        std::vector<bool> seen(rank, false);
        std::vector<Dim> out;
        for (auto p : perm) {
          require(p >= 0 && static_cast<std::size_t>(p) < rank && !seen[static_cast<std::size_t>(p)],
                  "perm is not a permutation");
          seen[static_cast<std::size_t>(p)] = true;
          out.push_back(s0[static_cast<std::size_t>(p)]);
        }
        return {t0, Shape(std::move(out))};
      }
      case OpKind::Slice: {
        const auto &st = attrs.get_ints("starts"), &en = attrs.get_ints("ends"), &sp = attrs.get_ints("steps");
        require(st.size() == rank && en.size() == rank && sp.size() == rank,
                "starts/ends/steps need one entry per axis");
        std::vector<Dim> out;
        for (std::size_t i = 0; i < rank; ++i) {
          require(sp[i] >= 1, "steps must be >= 1 (use flip for reversal)");
          if (!s0[i].is_static()) {
            require(st[i] == 0 && en[i] == std::numeric_limits<std::int64_t>::max() && sp[i] == 1,
                    "cannot slice the symbolic dim " + s0[i].sym);
            out.push_back(s0[i]);
            continue;
          }
          require(0 <= st[i] && st[i] <= en[i] && en[i] <= s0[i].size,
                  "slice [" + std::to_string(st[i]) + ":" + std::to_string(en[i]) + "] is out of range on axis " +
                      std::to_string(i));
          const std::int64_t span = en[i] - st[i];  // >= 0, no overflow: both are in [0, extent]
          out.emplace_back(span / sp[i] + (span % sp[i] != 0));
        }
        return {t0, Shape(std::move(out))};
      }
      case OpKind::Concat: {
        auto axis = static_cast<std::size_t>(normalize_axis(attrs.get_int("axis"), rank));
        std::vector<Dim> out = s0.dims();
        std::int64_t total = 0;
        for (int i = 0; i < n_in; ++i) {
          const Shape& s = in(i).shape;
          require(in(i).dtype == t0, "input dtypes differ");
          require(s.rank() == rank, "input ranks differ");
          for (std::size_t d = 0; d < rank; ++d)
            if (d != axis) require(s[d] == s0[d], "dims differ off the concat axis");
          require(s[axis].is_static(), "cannot concat along a symbolic dim");
          total = limits::checked_add(total, s[axis].size, "the concat axis");
        }
        out[axis] = Dim(total);
        return {t0, Shape(std::move(out))};
      }
      case OpKind::Pad: {
        const auto& pads = attrs.get_ints("pads");
        require(pads.size() == 2 * rank, "pads needs 2 entries per axis (befores then afters)");
        std::vector<Dim> out;
        for (std::size_t i = 0; i < rank; ++i) {
          if (pads[i] == 0 && pads[i + rank] == 0) {
            out.push_back(s0[i]);
            continue;
          }
          require(s0[i].is_static(), "cannot pad a symbolic dim");
          auto e = limits::checked_add(limits::checked_add(s0[i].size, pads[i], "pad"), pads[i + rank], "pad");
          require(e >= 0, "padding crops axis " + std::to_string(i) + " below zero");
          out.emplace_back(e);
        }
        return {t0, Shape(std::move(out))};
      }
      case OpKind::Gather: {
        const Shape& si = in(1).shape;
        require(is_integer(in(1).dtype), "indices must be integers");
        require(si.rank() == rank, "indices need the input's rank");
        auto axis = static_cast<std::size_t>(normalize_axis(attrs.get_int("axis"), rank));
        for (std::size_t d = 0; d < rank; ++d)
          if (d != axis && si[d].is_static() && s0[d].is_static())
            require(si[d].size <= s0[d].size, "indices exceed the input on axis " + std::to_string(d));
        return {t0, si};
      }
      case OpKind::IndexSelect: {
        require(is_integer(in(1).dtype), "indices must be integers");
        auto axis = static_cast<std::size_t>(normalize_axis(attrs.get_int("axis"), rank));
        require(rank > 0, "needs rank >= 1");
        std::vector<Dim> out(s0.dims().begin(), s0.dims().begin() + static_cast<std::ptrdiff_t>(axis));
        for (const auto& d : in(1).shape.dims()) out.push_back(d);
        out.insert(out.end(), s0.dims().begin() + static_cast<std::ptrdiff_t>(axis) + 1, s0.dims().end());
        return {t0, Shape(std::move(out))};
      }
      case OpKind::ScatterAdd: {
        require(is_integer(in(1).dtype), "indices must be integers");
        require(in(1).shape == in(2).shape, "indices and updates shapes differ");
        require(in(2).dtype == t0, "updates dtype differs");
        require(in(1).shape.rank() == rank, "indices need the input's rank");
        normalize_axis(attrs.get_int("axis"), rank);
        return {t0, s0};
      }
      case OpKind::Squeeze: {
        std::vector<bool> drop(rank, false);
        for (auto a : attrs.get_ints("axes")) {
          auto ax = static_cast<std::size_t>(normalize_axis(a, rank));
          require(is_one(s0[ax]), "axis " + std::to_string(a) + " has extent " + s0[ax].str() + ", not 1");
          drop[ax] = true;
        }
        std::vector<Dim> out;
        for (std::size_t i = 0; i < rank; ++i)
          if (!drop[i]) out.push_back(s0[i]);
        return {t0, Shape(std::move(out))};
      }
      case OpKind::Unsqueeze: {
        const auto& axes = attrs.get_ints("axes");
        std::size_t out_rank = rank + axes.size();
        std::vector<bool> add(out_rank, false);
        for (auto a : axes) {
          auto ax = static_cast<std::size_t>(normalize_axis(a, out_rank));
          require(!add[ax], "axis repeated");
          add[ax] = true;
        }
        std::vector<Dim> out;
        std::size_t j = 0;
        for (std::size_t i = 0; i < out_rank; ++i) out.push_back(add[i] ? Dim(1) : s0[j++]);
        return {t0, Shape(std::move(out))};
      }
      case OpKind::Flip:
        for (auto a : attrs.get_ints("axes")) normalize_axis(a, rank);
        return {t0, s0};
      case OpKind::Linear: {
        const Shape& w = in(1).shape;
        require(is_float(t0) && in(1).dtype == t0, "needs float x and w of the same dtype");
        require(rank >= 1 && w.rank() == 2, "needs x [..., in] and w [in, out]");
        require(s0[rank - 1] == w[0], "x's last dim " + s0[rank - 1].str() + " differs from w's first " + w[0].str());
        if (n_in == 3) require(in(2).shape == Shape(std::vector<Dim>{w[1]}) && in(2).dtype == t0, "bias must be [out]");
        auto out = s0.dims();
        out.back() = w[1];
        return {t0, Shape(std::move(out))};
      }
      case OpKind::Softmax:
      case OpKind::LogSoftmax:
        require(is_float(t0), "needs a float input");
        normalize_axis(attrs.get_int("axis"), rank);
        return {t0, s0};
      case OpKind::LayerNorm: {
        require(is_float(t0), "needs a float input");
        auto axis = static_cast<std::size_t>(normalize_axis(attrs.get_int("axis"), rank));
        Shape norm(std::vector<Dim>(s0.dims().begin() + static_cast<std::ptrdiff_t>(axis), s0.dims().end()));
        for (int i = 1; i < n_in; ++i)
          require(in(i).shape == norm && in(i).dtype == t0, "gamma/beta must be " + norm.str());
        return {t0, s0};
      }
      case OpKind::RmsNorm:
        require(is_float(t0) && rank >= 1, "needs a float input of rank >= 1");
        if (n_in == 2)
          require(in(1).shape == Shape(std::vector<Dim>{s0[rank - 1]}) && in(1).dtype == t0,
                  "gamma must be [last dim]");
        return {t0, s0};
      // Backward ops: (forward value, output cotangent[, gamma]) -> input cotangent.
      case OpKind::SoftmaxBackward:
      case OpKind::LogSoftmaxBackward:
        require(is_float(t0), "needs a float input");
        require(in(1).dtype == t0 && in(1).shape == s0, "y and dy must have the same dtype and shape");
        normalize_axis(attrs.get_int("axis"), rank);
        return {t0, s0};
      case OpKind::LayerNormBackward:
      case OpKind::RmsNormBackward: {
        require(is_float(t0), "needs a float input");
        require(in(1).dtype == t0 && in(1).shape == s0, "x and dy must have the same dtype and shape");
        std::size_t axis = rank ? rank - 1 : 0;
        if (op == OpKind::LayerNormBackward)
          axis = static_cast<std::size_t>(normalize_axis(attrs.get_int("axis"), rank));
        else
          require(rank >= 1, "needs rank >= 1");
        Shape norm(std::vector<Dim>(s0.dims().begin() + static_cast<std::ptrdiff_t>(axis), s0.dims().end()));
        if (n_in == 3) require(in(2).shape == norm && in(2).dtype == t0, "gamma must be " + norm.str());
        return {t0, s0};
      }
      case OpKind::Conv1d:
      case OpKind::Conv2d:
      case OpKind::MaxPool2d:
      case OpKind::AvgPool2d: {
        bool pool = op == OpKind::MaxPool2d || op == OpKind::AvgPool2d;
        std::size_t sp = op == OpKind::Conv1d ? 1 : 2;
        require(is_float(t0), "needs a float input");
        require(rank == sp + 2 && s0.is_static(), "input must be static N,C" + std::string(sp == 1 ? ",L" : ",H,W"));
        auto ints = [&](std::string_view k) {
          auto v = attrs.get_ints(k);
          if (v.size() == 1 && sp == 2) v.push_back(v[0]);
          require(v.size() == sp, std::string(k) + " needs " + std::to_string(sp) + " entries");
          return v;
        };
        auto stride = ints("stride"), padding = ints("padding");
        std::vector<std::int64_t> dilation(sp, 1), kernel;
        std::int64_t out_c = s0[1].size;
        if (pool) {
          kernel = ints("kernel");
        } else {
          dilation = ints("dilation");
          const Shape& w = in(1).shape;
          auto groups = attrs.get_int("groups");
          require(in(1).dtype == t0 && w.rank() == rank && w.is_static(), "weight must be [O, C/groups, k...]");
          require(groups >= 1 && s0[1].size % groups == 0 && w[0].size % groups == 0, "groups must divide C and O");
          require(w[1].size * groups == s0[1].size, "weight has " + w[1].str() +
                                                        " input channels per group, input has " + s0[1].str() +
                                                        " channels and groups=" + std::to_string(groups));
          out_c = w[0].size;
          for (std::size_t i = 0; i < sp; ++i) kernel.push_back(w[2 + i].size);
          if (n_in == 3) require(in(2).shape == Shape{out_c} && in(2).dtype == t0, "bias must be [O]");
        }
        std::vector<Dim> out{s0[0], Dim(out_c)};
        for (std::size_t i = 0; i < sp; ++i) {
          require(stride[i] >= 1 && dilation[i] >= 1 && padding[i] >= 0 && kernel[i] >= 1,
                  "stride/dilation/kernel must be >= 1");
          using limits::checked_add, limits::checked_mul;
          auto eff =
              checked_add(checked_mul(dilation[i], kernel[i] - 1, "the dilated kernel"), 1, "the dilated kernel");
          auto e = checked_add(s0[2 + i].size, checked_mul(2, padding[i], "the padding"), "the padded input") - eff;
          require(e >= 0, "kernel is larger than the padded input");
          out.emplace_back(e / stride[i] + 1);
        }
        return {t0, Shape(std::move(out))};
      }
      case OpKind::Embedding: {
        require(rank == 2, "table must be [vocab, dim]");
        require(is_integer(in(1).dtype), "ids must be integers");
        auto out = in(1).shape.dims();
        out.push_back(s0[1]);
        return {t0, Shape(std::move(out))};
      }
      case OpKind::Attention: {
        const Shape &k = in(1).shape, &v = in(2).shape;
        require(is_float(t0) && in(1).dtype == t0 && in(2).dtype == t0, "q, k, v must share a float dtype");
        require(rank == 4 && k.rank() == 4 && v.rank() == 4, "q, k, v must be [B, H, S, D]");
        require(s0[0] == k[0] && s0[1] == k[1] && k[0] == v[0] && k[1] == v[1], "batch/head dims differ");
        require(s0[3] == k[3], "q and k head dims differ");
        require(k[2] == v[2], "k and v sequence lengths differ");
        if (n_in == 4) {
          const Node& m = in(3);
          require(m.dtype == DType::Bool || m.dtype == t0, "mask must be bool or q's dtype");
          Shape scores(std::vector<Dim>{s0[0], s0[1], s0[2], k[2]});
          require(broadcast_shapes(m.shape, scores) == scores, "mask does not broadcast to " + scores.str());
        }
        return {t0, Shape(std::vector<Dim>{s0[0], s0[1], s0[2], v[3]})};
      }
      default: break;
    }
    fail(g, op, inputs, "has no inference rule");
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.rfind(std::string(op_name(op)) + " with inputs", 0) == 0) throw;
    fail(g, op, inputs, msg);
  }
}

}  // namespace

TypeInfo infer_type(const Graph& g, OpKind op, std::span<const NodeId> inputs, const Attrs& attrs,
                    const TypeInfo* declared) {
  TypeInfo t = infer_unchecked(g, op, inputs, attrs, declared);
  // The one gate every node's shape passes: custom ops' infer rules, declared
  // leaves and inferred results alike.
  try {
    check_shape(t.shape, "the result");
  } catch (const Error& e) {
    fail(g, op, inputs, e.what());
  }
  // A declaration that inference contradicts is an error, whichever op it is on (never silently replaced).
  if (declared && (declared->dtype != t.dtype || declared->shape != t.shape))
    fail(g, op, inputs,
         "declared " + std::string(dtype_name(declared->dtype)) + declared->shape.str() + " but inference gives " +
             std::string(dtype_name(t.dtype)) + t.shape.str());
  return t;
}

}  // namespace rlx::ir
