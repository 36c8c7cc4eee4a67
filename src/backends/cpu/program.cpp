#include "backends/cpu/program.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>

#include "rlx/error.hpp"
#include "rlx/ir/op_def.hpp"

namespace rlx::backends::cpu {

using ir::DType;
using ir::NodeId;
using ir::OpKind;

CT compute_type(DType t) {
  if (ir::is_storage_float(t)) return CT::F32;
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16: return CT::F32;
    case DType::F64: return CT::F64;
    case DType::I64:
    case DType::U32: return CT::I64;
    case DType::U64: return CT::U64;
    default: return CT::I32;
  }
}

DType storage_of(CT t) {
  switch (t) {
    case CT::F32: return DType::F32;
    case CT::F64: return DType::F64;
    case CT::I32: return DType::I32;
    case CT::I64: return DType::I64;
    case CT::U64: return DType::U64;
  }
  return DType::F32;
}

int body_input_index(const ir::Node& n, int ordinal) {
  if (n.attrs.has("name")) {
    const std::string& s = n.attrs.get_str("name");
    if (s.size() > 2 && s.compare(0, 2, "in") == 0 &&
        std::all_of(s.begin() + 2, s.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return std::stoi(s.substr(2));
  }
  return ordinal;
}

namespace {

// dtypes narrower than their compute type: results are rounded to them.
bool is_narrow(DType t) {
  return t == DType::F16 || t == DType::BF16 || t == DType::I8 || t == DType::U8 || t == DType::I16 ||
         t == DType::U16 || t == DType::U32 || ir::is_storage_only(t);
}

// A cast's rounding mode as Instr::i0 of its Narrow (bit 0: not saturating; bits 1-2: the e8m0 round mode),
// 0 for ONNX's defaults (elementwise/program_impl read it back with the same layout).
std::int64_t cast_mode_bits(const ir::Node& n) {
  if (n.op != OpKind::Cast) return 0;
  const ir::CastMode m = ir::cast_mode(n.attrs);
  return (m.saturate ? 0 : 1) | std::int64_t(m.round) << 1;
}

// Ops whose result is representable in the input dtype whenever the inputs are.
bool is_closed(OpKind op, DType t) {
  switch (op) {
    case OpKind::Max:
    case OpKind::Min:
    case OpKind::Where:
    case OpKind::Relu:
    case OpKind::Sign:
    case OpKind::Floor:
    case OpKind::Ceil:
    case OpKind::Round: return true;
    case OpKind::Neg:
    case OpKind::Abs: return ir::is_float(t);
    default: return false;
  }
}

std::optional<Op> unary_op(OpKind k) {
  switch (k) {
    case OpKind::Neg: return Op::Neg;
    case OpKind::Abs: return Op::Abs;
    case OpKind::Exp: return Op::Exp;
    case OpKind::Log: return Op::Log;
    case OpKind::Sqrt: return Op::Sqrt;
    case OpKind::Rsqrt: return Op::Rsqrt;
    case OpKind::Reciprocal: return Op::Recip;
    case OpKind::Tanh: return Op::Tanh;
    case OpKind::Sigmoid: return Op::Sigmoid;
    case OpKind::Relu: return Op::Relu;
    case OpKind::Gelu: return Op::Gelu;
    case OpKind::GeluTanh: return Op::GeluTanh;
    case OpKind::Silu: return Op::Silu;
    case OpKind::Softplus: return Op::Softplus;
    case OpKind::Erf: return Op::Erf;
    case OpKind::Sin: return Op::Sin;
    case OpKind::Cos: return Op::Cos;
    case OpKind::Floor: return Op::Floor;
    case OpKind::Ceil: return Op::Ceil;
    case OpKind::Round: return Op::Round;
    case OpKind::Sign: return Op::Sign;
    case OpKind::Not: return Op::Not;
    default: return std::nullopt;
  }
}

std::optional<Op> binary_op(OpKind k) {
  switch (k) {
    case OpKind::Add: return Op::Add;
    case OpKind::Sub: return Op::Sub;
    case OpKind::Mul: return Op::Mul;
    case OpKind::Div: return Op::Div;
    case OpKind::Pow: return Op::Pow;
    case OpKind::Max: return Op::Max;
    case OpKind::Min: return Op::Min;
    case OpKind::Mod: return Op::Mod;
    case OpKind::Eq: return Op::Eq;
    case OpKind::Ne: return Op::Ne;
    case OpKind::Lt: return Op::Lt;
    case OpKind::Le: return Op::Le;
    case OpKind::Gt: return Op::Gt;
    case OpKind::Ge: return Op::Ge;
    case OpKind::And: return Op::And;
    case OpKind::Or: return Op::Or;
    default: return std::nullopt;
  }
}

}  // namespace

bool has_instruction(OpKind op) {
  return unary_op(op) || binary_op(op) || op == OpKind::Where || op == OpKind::Cast || op == OpKind::Clamp;
}

namespace {

// Per-dim element strides of a `shape` tensor broadcast (right-aligned) to
// `iter`; nullopt when it does not broadcast.
std::optional<std::vector<std::int64_t>> broadcast_strides(std::vector<std::int64_t> shape,
                                                           const std::vector<std::int64_t>& iter) {
  while (shape.size() > iter.size() && shape.front() == 1) shape.erase(shape.begin());
  if (shape.size() > iter.size()) return std::nullopt;
  std::vector<std::int64_t> st(iter.size(), 0);
  auto cs = ir::contiguous_strides(shape);
  std::size_t lead = iter.size() - shape.size();
  for (std::size_t j = 0; j < shape.size(); ++j) {
    if (shape[j] == iter[lead + j] && shape[j] != 1)
      st[lead + j] = cs[j];
    else if (shape[j] != 1)
      return std::nullopt;
  }
  return st;
}

bool is_f32_unary(Op op) { return op <= Op::Sign; }
bool is_f32_binary(Op op) { return op >= Op::Add && op <= Op::Mod; }

// Instructions a fused run can evaluate: f32 arithmetic and f32 stores.
bool fusable(const Instr& in, const std::vector<StoreSpec>& stores) {
  if (in.ct != CT::F32) return false;
  if (in.op == Op::Store) return stores[std::size_t(in.io)].dtype == DType::F32;
  return in.ct2 == CT::F32 && (is_f32_unary(in.op) || is_f32_binary(in.op) || in.op == Op::Clamp);
}

bool reads(const Instr& in, int s) { return in.a == s || in.b == s || in.c == s; }

// Rewrites every maximal run of fusable block instructions into one Op::Fused
// instruction. A value stays in `acc` between consecutive steps and is saved to
// its slot only when something else reads it: a later step once acc has moved
// on, an unfused instruction, or the caller (the result slot).
void fuse(CompiledProgram& cp, int result) {
  const auto& code = cp.code;
  std::vector<Instr> out;
  for (std::size_t s = 0; s < code.size();) {
    if (!fusable(code[s], cp.stores)) {
      out.push_back(code[s++]);
      continue;
    }
    std::size_t e = s;
    while (e < code.size() && fusable(code[e], cp.stores)) ++e;
    Instr fused{Op::Fused};
    fused.io = int(cp.micros.size());
    auto emit = [&](int code, int slot = -1) {
      Micro m;
      m.code = std::uint8_t(code);
      m.slot = std::int16_t(slot);
      cp.micros.push_back(m);
      return &cp.micros.back();
    };
    // A read at k sees acc when only stores of d itself (which leave acc
    // alone) lie between i and k.
    auto needs_save = [&](std::size_t i, int d) {
      bool acc_live = true;
      for (std::size_t k = i + 1; k < code.size(); ++k) {
        if (reads(code[k], d) && !(acc_live && k < e)) return true;
        if (code[k].op != Op::Store || code[k].a != d) {
          acc_live = false;
          if (code[k].dst == d) return false;
        }
      }
      return d == result;
    };
    int acc = -1;
    for (std::size_t i = s; i < e; ++i) {
      const Instr& in = code[i];
      const bool uni_a = in.uniform & 1, uni_b = in.uniform & 2;
      auto load = [&](int slot, bool uniform) {
        emit(uniform ? micro::kLoadUniform : micro::kLoadStream, slot);
        acc = slot;
      };
      if (in.op == Op::Store) {
        if (in.a != acc) load(in.a, false);
        emit(micro::kStore)->io = in.io;
        continue;
      }
      if (is_f32_binary(in.op)) {
        const int op = micro::kBinary + 5 * (int(in.op) - int(Op::Add));
        if (in.a != acc && in.b == acc) {
          emit(op + (uni_a ? 4 : 3), in.a);
        } else {
          if (in.a != acc) load(in.a, uni_a);
          emit(op + (in.b == acc ? 0 : uni_b ? 2 : 1), in.b);
        }
      } else {
        if (in.a != acc) load(in.a, uni_a);
        if (in.op == Op::Clamp) {
          Micro* m = emit(micro::kClamp);
          m->f0 = float(in.f0);
          m->f1 = float(in.f1);
        } else {
          emit(micro::kUnary + int(in.op));
        }
      }
      acc = in.dst;
      if (needs_save(i, in.dst)) emit(micro::kSave, in.dst);
    }
    fused.i0 = std::int64_t(cp.micros.size()) - fused.io;
    out.push_back(fused);
    s = e;
  }
  cp.code = std::move(out);
}

}  // namespace

ProgramBuilder::ProgramBuilder(const ir::Graph& body, std::vector<std::int64_t> iter, std::vector<int> order)
    : body_(body), iter_(std::move(iter)), order_(std::move(order)) {
  if (order_.empty()) {
    order_.resize(iter_.size());
    std::iota(order_.begin(), order_.end(), 0);
  }
}

void ProgramBuilder::bind(NodeId node, Source src) { sources_[node] = std::move(src); }
void ProgramBuilder::store(NodeId node, std::int32_t buffer, DType dtype, bool stream) {
  stores_.push_back({node, StoreSpec{buffer, dtype, stream}});
}
void ProgramBuilder::result(NodeId node) { result_ = node; }

std::unique_ptr<CompiledProgram> ProgramBuilder::build(const std::string& what) {
  auto cp = std::make_unique<CompiledProgram>();
  const std::size_t n_nodes = body_.size();
  auto fail = [&](const ir::Node& n, const std::string& msg) -> void {
    throw Error(what + ": " + ir::describe_node(body_, n) + ": " + msg);
  };

  // Nodes to evaluate: everything the stores and the result need, stopping at bound nodes.
  std::vector<bool> needed(n_nodes, false);
  std::vector<int> uses(n_nodes, 0);
  std::vector<NodeId> work;
  for (const auto& s : stores_) work.push_back(s.node);
  if (result_ < n_nodes) work.push_back(result_);
  for (NodeId w : work) {
    uses[w] = 1 << 28;  // stored values live to the end of the block
  }
  while (!work.empty()) {
    NodeId id = work.back();
    work.pop_back();
    if (needed[id]) continue;
    needed[id] = true;
    if (sources_.count(id)) continue;
    for (NodeId in : body_.node(id).inputs) work.push_back(in);
  }
  for (NodeId id = 0; id < n_nodes; ++id)
    if (needed[id] && !sources_.count(id))
      for (NodeId in : body_.node(id).inputs) ++uses[in];

  // Iteration extents in iteration order.
  std::vector<std::int64_t> ext(iter_.size());
  for (std::size_t i = 0; i < order_.size(); ++i) ext[i] = iter_[std::size_t(order_[i])];
  const std::int64_t total = std::accumulate(ext.begin(), ext.end(), std::int64_t(1), std::multiplies<>());

  // Slots: registers are allocated lowest-free-first; direct slots are numbered after them.
  std::vector<int> slot_of(n_nodes, -1);
  std::vector<bool> direct_node(n_nodes, false), uniform(n_nodes, false);
  std::vector<int> refs;     // live nodes per register
  std::vector<bool> pinned;  // registers filled once per task
  std::vector<int> free_regs;
  // Pinned registers are written once per task before any block runs, so
  // they never reuse a register that block code writes.
  auto alloc = [&](bool pin) {
    int r;
    if (!pin && !free_regs.empty()) {
      auto it = std::min_element(free_regs.begin(), free_regs.end());
      r = *it;
      free_regs.erase(it);
    } else {
      r = int(refs.size());
      refs.push_back(0);
      pinned.push_back(false);
    }
    pinned[std::size_t(r)] = pin;
    return r;
  };
  auto assign = [&](NodeId id, int slot) {
    slot_of[id] = slot;
    if (!direct_node[id]) ++refs[std::size_t(slot)];
  };
  auto release = [&](NodeId id) {
    if (direct_node[id] || slot_of[id] < 0) return;
    auto r = std::size_t(slot_of[id]);
    if (--refs[r] == 0 && !pinned[r]) free_regs.push_back(int(r));
  };
  auto emit = [&](bool init, Instr in) { (init ? cp->init : cp->code).push_back(in); };
  std::vector<std::pair<NodeId, int>> direct_slots;  // node, load index

  auto add_load = [&](NodeId id, const Source& src, const std::byte* fixed) {
    const ir::Node& n = body_.node(id);
    LoadSpec l;
    l.fixed = fixed;
    l.buffer = src.buffer;
    l.dtype = src.dtype;
    auto st0 = broadcast_strides(src.shape, iter_);
    if (!st0) fail(n, "operand does not broadcast to the kernel's iteration shape");
    std::vector<std::int64_t> e, s;
    for (std::size_t i = 0; i < order_.size(); ++i) {
      if (ext[i] == 1) continue;
      std::int64_t stride = (*st0)[std::size_t(order_[i])];
      if (!e.empty() && s.back() == stride * ext[i]) {  // merge with the previous dim
        e.back() *= ext[i];
        s.back() = stride;
        continue;
      }
      e.push_back(ext[i]);
      s.push_back(stride);
    }
    bool all_zero = std::all_of(s.begin(), s.end(), [](auto v) { return v == 0; });
    if (total == 0 || (e.size() == 1 && s[0] == 1) || e.empty()) {
      l.kind = e.empty() ? LoadKind::Scalar : LoadKind::Contig;
      if (total == 0) l.kind = LoadKind::Contig;
    } else if (all_zero) {
      l.kind = LoadKind::Scalar;
    } else if (e.size() == 2 && s[0] == 0 && s[1] == 1) {
      l.kind = LoadKind::Row;
      l.period = e[1];
    } else {
      if (e.size() > std::size_t(kMaxRank)) fail(n, "operand broadcast is too irregular (rank > 16)");
      l.kind = LoadKind::Strided;
      l.rank = int(e.size());
      for (std::size_t i = 0; i < e.size(); ++i) {
        l.ext[i] = e[i];
        l.stride[i] = s[i];
      }
    }
    const CT ct = compute_type(n.dtype);
    const bool narrowing = src.dtype != n.dtype && is_narrow(n.dtype);
    const int io = int(cp->loads.size());
    cp->loads.push_back(l);
    if (l.kind == LoadKind::Scalar) {
      uniform[id] = true;
      int r = alloc(true);
      emit(true, Instr{Op::Load, ct, ct, src.dtype, std::int16_t(r), -1, -1, -1, io});
      if (narrowing) emit(true, Instr{Op::Narrow, ct, ct, n.dtype, std::int16_t(r), std::int16_t(r)});
      assign(id, r);
    } else if (l.kind == LoadKind::Contig && src.dtype == storage_of(ct) && !narrowing) {
      direct_node[id] = true;
      direct_slots.emplace_back(id, io);
    } else {
      int r = alloc(false);
      emit(false, Instr{Op::Load, ct, ct, src.dtype, std::int16_t(r), -1, -1, -1, io});
      if (narrowing) emit(false, Instr{Op::Narrow, ct, ct, n.dtype, std::int16_t(r), std::int16_t(r)});
      assign(id, r);
    }
  };

  // Direct slots get their numbers once the register count is known; until
  // then they are encoded as -2 - k and patched below.
  auto slot16 = [&](NodeId id) -> std::int16_t {
    if (direct_node[id]) {
      for (std::size_t k = 0; k < direct_slots.size(); ++k)
        if (direct_slots[k].first == id) return std::int16_t(-2 - int(k));
    }
    return std::int16_t(slot_of[id]);
  };

  for (NodeId id = 0; id < n_nodes; ++id) {
    if (!needed[id]) continue;
    const ir::Node& n = body_.node(id);
    if (auto it = sources_.find(id); it != sources_.end()) {
      add_load(id, it->second, nullptr);
      continue;
    }
    if (n.op == OpKind::Input) fail(n, "body input is not bound to a kernel input");
    if (n.op == OpKind::Constant) {
      if (!n.value) fail(n, "constant has no value");
      const ir::Tensor& v = *n.value;
      if (v.numel() == 1) {
        Instr in{Op::Fill, compute_type(n.dtype)};
        in.f0 = ir::round_to_dtype(v.get(0), n.dtype);
        if (v.dtype() == DType::I64)
          std::memcpy(&in.i0, v.data(), 8);
        else
          in.i0 = std::int64_t(in.f0);
        int r = alloc(true);
        in.dst = std::int16_t(r);
        emit(true, in);
        uniform[id] = true;
        assign(id, r);
      } else {
        cp->constants.push_back(n.value);
        add_load(id, Source{0, v.dtype(), v.shape()}, v.data());
      }
      continue;
    }
    bool uni = std::all_of(n.inputs.begin(), n.inputs.end(), [&](NodeId i) { return uniform[i]; });
    uniform[id] = uni;
    const DType in_dtype = n.inputs.empty() ? n.dtype : body_.node(n.inputs[0]).dtype;
    const CT ct = compute_type(n.op == OpKind::Where ? n.dtype : in_dtype);
    const CT out_ct = compute_type(n.dtype);
    auto operand = [&](std::size_t i) { return slot16(n.inputs[i]); };
    // Block code reads uniform operands once (see Instr::uniform).
    auto emit_op = [&](Instr in) {
      if (!uni)
        for (std::size_t i = 0; i < n.inputs.size() && i < 3; ++i)
          if (uniform[n.inputs[i]]) in.uniform |= std::uint8_t(1u << i);
      emit(uni, in);
    };
    bool need_narrow = is_narrow(n.dtype) && !is_closed(n.op, n.dtype);
    int dst = -1;
    if (n.op == OpKind::Cast) {
      const DType to = n.dtype;
      if (to == DType::Bool) {
        dst = alloc(uni);
        emit_op(Instr{Op::Cast, ct, CT::I32, DType::Bool, std::int16_t(dst), operand(0)});
      } else if (ct == out_ct) {
        if (is_narrow(to) && to != in_dtype && in_dtype != DType::Bool) {
          dst = alloc(uni);
          Instr in{Op::Narrow, ct, ct, to, std::int16_t(dst), operand(0)};
          in.i0 = cast_mode_bits(n);
          emit_op(in);
        } else {
          // Same values in the same compute type: the cast is free.
          NodeId src = n.inputs[0];
          if (direct_node[src]) {
            direct_node[id] = true;
            for (auto& ds : direct_slots)
              if (ds.first == src) {
                direct_slots.emplace_back(id, ds.second);
                break;
              }
          } else {
            assign(id, slot_of[src]);
          }
          uniform[id] = uniform[src];
        }
      } else if (ir::is_storage_only(to) && (ct == CT::F32 || ct == CT::F64)) {
        // A float into int4/int2: Narrow on the float (truncated, 0 outside the type), then an exact cast.
        const int tmp = alloc(uni);
        emit_op(Instr{Op::Narrow, ct, ct, to, std::int16_t(tmp), operand(0)});
        dst = alloc(uni);
        emit(uni, Instr{Op::Cast, ct, out_ct, to, std::int16_t(dst), std::int16_t(tmp)});
        if (!uni) free_regs.push_back(tmp);  // the truncated float is read once, just above
      } else {
        dst = alloc(uni);
        emit_op(Instr{Op::Cast, ct, out_ct, to, std::int16_t(dst), operand(0)});
        if (is_narrow(to)) {
          Instr in{Op::Narrow, out_ct, out_ct, to, std::int16_t(dst), std::int16_t(dst)};
          in.i0 = cast_mode_bits(n);
          emit(uni, in);
        }
      }
      need_narrow = false;
    } else if (n.op == OpKind::Where) {
      dst = alloc(uni);
      emit_op(Instr{Op::Where, ct, ct, n.dtype, std::int16_t(dst), operand(0), operand(1), operand(2)});
    } else if (n.op == OpKind::Clamp) {
      dst = alloc(uni);
      Instr in{Op::Clamp, ct, ct, n.dtype, std::int16_t(dst), operand(0)};
      in.f0 = n.attrs.get_float("min");
      in.f1 = n.attrs.get_float("max");
      // A NaN bound gives NaN (numpy's clip): with both bounds NaN, max then min propagate it on every ISA.
      if (std::isnan(in.f0) || std::isnan(in.f1)) in.f0 = in.f1 = std::nan("");
      emit_op(in);
    } else if (auto u = unary_op(n.op)) {
      dst = alloc(uni);
      emit_op(Instr{*u, ct, out_ct, n.dtype, std::int16_t(dst), operand(0)});
    } else if (auto b = binary_op(n.op)) {
      dst = alloc(uni);
      emit_op(Instr{*b, ct, out_ct, n.dtype, std::int16_t(dst), operand(0), operand(1)});
    } else {
      fail(n, "is not an elementwise op the CPU backend can fuse");
    }
    if (dst >= 0) {
      if (need_narrow) emit(uni, Instr{Op::Narrow, out_ct, out_ct, n.dtype, std::int16_t(dst), std::int16_t(dst)});
      assign(id, dst);
    }
    // Operands are released after the result is allocated, so a result never
    // aliases an operand of another type within one instruction.
    std::vector<NodeId> ins = n.inputs;
    std::sort(ins.begin(), ins.end());
    ins.erase(std::unique(ins.begin(), ins.end()), ins.end());
    for (NodeId in : ins) {
      int count = int(std::count(n.inputs.begin(), n.inputs.end(), in));
      uses[in] -= count;
      if (uses[in] == 0) release(in);
    }
  }

  for (const auto& s : stores_) {
    const ir::Node& n = body_.node(s.node);
    if (compute_type(n.dtype) != compute_type(s.spec.dtype)) fail(n, "is stored to a buffer of another dtype");
    cp->stores.push_back(s.spec);
    emit(false, Instr{Op::Store, compute_type(n.dtype), compute_type(n.dtype), s.spec.dtype, -1, slot16(s.node), -1, -1,
                      int(cp->stores.size() - 1)});
  }

  const int n_regs = int(refs.size());
  auto patch = [&](std::int16_t& v) {
    if (v <= -2) v = std::int16_t(n_regs + (-2 - v));
  };
  for (auto* list : {&cp->init, &cp->code})
    for (auto& in : *list) {
      patch(in.dst);
      patch(in.a);
      patch(in.b);
      patch(in.c);
    }
  for (const auto& ds : direct_slots) cp->direct.push_back(ds.second);
  std::int16_t result_slot = -1;
  if (result_ < n_nodes) {
    result_slot = slot16(result_);
    patch(result_slot);
  }
  fuse(*cp, result_slot);

  Program& p = cp->view;
  p.init = cp->init.data();
  p.n_init = int(cp->init.size());
  p.code = cp->code.data();
  p.n_code = int(cp->code.size());
  p.loads = cp->loads.data();
  p.stores = cp->stores.data();
  p.direct = cp->direct.data();
  p.n_direct = int(cp->direct.size());
  p.micros = cp->micros.data();
  p.n_regs = n_regs;
  // Registers hold 4-byte values unless the program computes in f64/i64; a
  // three-line pad keeps them from sitting a multiple of 4 KiB apart.
  bool wide = false;
  for (auto* list : {&cp->init, &cp->code})
    for (const auto& in : *list)
      wide = wide || in.ct == CT::F64 || in.ct == CT::I64 || in.ct == CT::U64 || in.ct2 == CT::F64 ||
             in.ct2 == CT::I64 || in.ct2 == CT::U64;
  p.reg_bytes = kBlock * (wide ? 8 : 4) + 192;
  p.result = result_slot;
  p.streams = std::any_of(cp->stores.begin(), cp->stores.end(), [](const StoreSpec& s) { return s.stream; });
  cp->scratch_bytes =
      (std::size_t(p.n_regs + p.n_direct) * sizeof(void*) + 63) / 64 * 64 + std::size_t((p.n_regs + 1) * p.reg_bytes);
  return cp;
}

}  // namespace rlx::backends::cpu
