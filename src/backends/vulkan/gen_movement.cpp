#ifdef RLX_HAVE_VULKAN
// Movement kernels: one thread per output element computes where its value
// comes from and copies it as raw bits of the element's size. Indices for
// gather/index_select/scatter_add wrap once when negative; one still out of
// range is reported through the status words (an rlx::Error after the run).
// scatter_add copies x, then adds each update atomically (a compare-and-swap
// loop for floats and narrow types).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "backends/vulkan/codegen.hpp"

namespace rlx::backends::vulkan {

using ir::DType;
using ir::OpKind;
using Ints = std::vector<std::int64_t>;

namespace {

constexpr std::uint32_t kLocal = 256;

Ints strides_of(const Ints& s) {
  Ints st(s.size(), 1);
  for (std::size_t d = s.size(); d-- > 1;) st[d - 1] = st[d] * s[d];
  return st;
}
std::int64_t norm_axis(std::int64_t a, std::size_t rank) { return a < 0 ? a + std::int64_t(rank) : a; }

// "c0 * s0 + c1 * s1 ..." over the given (coordinate, stride) pairs; "0u" when empty.
std::string dot(const std::vector<std::pair<std::string, std::int64_t>>& terms) {
  std::string e;
  for (const auto& [c, s] : terms) {
    if (s == 0) continue;
    e += (e.empty() ? "" : " + ") + (s == 1 ? c : c + " * " + u(s));
  }
  return e.empty() ? "0u" : "(" + e + ")";
}

// The raw bits of `value` stored in dtype t, as a GLSL literal of the raw type.
std::string raw_literal(double value, DType t) {
  auto scalar = ir::Tensor::scalar(t, value);
  std::uint64_t bits = 0;
  std::memcpy(&bits, scalar.data(), ir::dtype_size(t));
  switch (ir::dtype_size(t)) {
    case 1: return fmt::format("uint8_t({}u)", bits);
    case 2: return fmt::format("uint16_t({}u)", bits);
    case 4: return fmt::format("{}u", bits);
    default: return fmt::format("{}ul", bits);
  }
}

std::string loop(std::int64_t n, const std::string& body) {
  return fmt::format(
      "uint rlx_n = gl_NumWorkGroups.x * {}u;\nfor (uint i = gl_GlobalInvocationID.x; i < {}; i += rlx_n) {{\n{}}}\n",
      kLocal, u(n), body);
}

// Reads index element `at` of buffer `idx` as j, wrapped once when negative; out of range records an
// error and skips. Unsigned arithmetic throughout: llvmpipe 15 miscompiles signed int64 comparisons here.
std::string index_code(Shader& sh, compile::BufferId idx, const std::string& at, std::int64_t extent) {
  const std::string e = std::to_string(extent) + "ul";
  return "uint64_t j = uint64_t(int64_t(" + sh.load(idx, at) + "));\nj += (j >> 63) * " + e + ";\n" + "if (j >= " + e +
         ") {\n" + sh.fail("int64_t(" + sh.load(idx, at) + ")") + "continue;\n}\n";
}

}  // namespace

KernelCode gen_movement(const GenCtx& c) {
  const auto& k = c.kernel;
  const ir::Graph& body = k.body;
  const ir::Node* mv = nullptr;
  for (const auto& n : body.nodes())
    if (n.op != OpKind::Input) mv = &n;
  if (!mv || k.outputs.size() != 1) throw NoShader{"not a movement kernel"};
  const compile::BufferId out = k.outputs[0];
  const Ints os = mv->shape.extents();
  const std::int64_t n = numel(os);
  if (n == 0) return {};
  auto in_buf = [&](std::size_t i) { return k.input_buffer(body.node(mv->inputs.at(i))); };
  const ir::Node& x = body.node(mv->inputs.at(0));
  const Ints xs = x.shape.extents(), xst = strides_of(xs);
  const std::size_t r = os.size();

  Shader sh(c);
  Space sp{os, "i", {}};
  std::string code = coords_code(sp, "c");
  const auto& cc = sp.coords;
  const auto& at = mv->attrs;
  KernelCode kc;
  auto copy_from = [&](compile::BufferId src, const std::string& idx) {
    return sh.raw(out, "i") + " = " + sh.raw(src, idx) + ";\n";
  };

  switch (mv->op) {
    case OpKind::Reshape: code += copy_from(in_buf(0), "i"); break;
    case OpKind::Expand: code += copy_from(in_buf(0), bcast_index(sp, xs)); break;
    case OpKind::Permute: {
      const auto& perm = at.get_ints("perm");
      std::vector<std::pair<std::string, std::int64_t>> t;
      for (std::size_t d = 0; d < r; ++d) t.push_back({cc[d], xst[std::size_t(norm_axis(perm[d], r))]});
      code += copy_from(in_buf(0), dot(t));
      break;
    }
    case OpKind::Slice: {
      const auto &st = at.get_ints("starts"), &sp_ = at.get_ints("steps");
      std::int64_t base = 0;
      std::vector<std::pair<std::string, std::int64_t>> t;
      for (std::size_t d = 0; d < r; ++d) {
        std::int64_t e = xs[d], s0 = st[d] < 0 ? st[d] + e : st[d];
        base += std::clamp<std::int64_t>(s0, 0, e) * xst[d];
        t.push_back({cc[d], xst[d] * sp_[d]});
      }
      code += copy_from(in_buf(0), "(" + u(base) + " + " + dot(t) + ")");
      break;
    }
    case OpKind::Flip: {
      std::vector<bool> f(r, false);
      for (auto a : at.get_ints("axes")) f[std::size_t(norm_axis(a, r))] = true;
      std::vector<std::pair<std::string, std::int64_t>> t;
      for (std::size_t d = 0; d < r; ++d)
        t.push_back({f[d] ? "(" + u(xs[d] - 1) + " - " + cc[d] + ")" : cc[d], xst[d]});
      code += copy_from(in_buf(0), dot(t));
      break;
    }
    case OpKind::Pad: {
      const auto& pads = at.get_ints("pads");
      std::string cond;
      std::vector<std::pair<std::string, std::int64_t>> t;
      for (std::size_t d = 0; d < r; ++d) {
        std::string s = "int(" + cc[d] + ") - " + std::to_string(pads[d]);
        code += "int s" + std::to_string(d) + " = " + s + ";\n";
        cond += (cond.empty() ? "" : " || ") + fmt::format("s{0} < 0 || s{0} >= {1}", d, xs[d]);
        t.push_back({"uint(s" + std::to_string(d) + ")", xst[d]});
      }
      std::string value = raw_literal(at.float_or("value", 0.0), mv->dtype);
      code += cond.empty()
                  ? copy_from(in_buf(0), "0u")
                  : "if (" + cond + ") " + sh.raw(out, "i") + " = " + value + ";\nelse " + copy_from(in_buf(0), dot(t));
      break;
    }
    case OpKind::Concat: {
      auto axis = std::size_t(norm_axis(at.get_int("axis"), r));
      std::int64_t begin = 0;
      std::string chain;
      for (std::size_t p = 0; p < mv->inputs.size(); ++p) {
        const Ints ps = body.node(mv->inputs[p]).shape.extents(), pst = strides_of(ps);
        if (ps[axis] == 0) continue;
        std::vector<std::pair<std::string, std::int64_t>> t;
        for (std::size_t d = 0; d < r; ++d)
          t.push_back({d == axis ? "(" + cc[d] + " - " + u(begin) + ")" : cc[d], pst[d]});
        chain += (chain.empty() ? "" : "else ") + fmt::format("if ({} < {}) ", cc[axis], u(begin + ps[axis])) + "{ " +
                 copy_from(in_buf(p), dot(t)) + "}\n";
        begin += ps[axis];
      }
      code += chain;
      break;
    }
    case OpKind::Gather: {
      auto axis = std::size_t(norm_axis(at.get_int("axis"), r));
      std::vector<std::pair<std::string, std::int64_t>> t;
      for (std::size_t d = 0; d < r; ++d) t.push_back({d == axis ? "uint(j)" : cc[d], xst[d]});
      code += index_code(sh, in_buf(1), "i", xs[axis]) + copy_from(in_buf(0), dot(t));
      kc.status_message = fmt::format("out of range for extent {} on axis {}", xs[axis], axis);
      break;
    }
    case OpKind::IndexSelect: {
      auto axis = std::size_t(norm_axis(at.get_int("axis"), xs.size()));
      const Ints is = body.node(mv->inputs[1]).shape.extents(), ist = strides_of(is);
      std::vector<std::pair<std::string, std::int64_t>> it, t;
      for (std::size_t d = 0; d < is.size(); ++d) it.push_back({cc[axis + d], ist[d]});
      for (std::size_t d = 0; d < axis; ++d) t.push_back({cc[d], xst[d]});
      t.push_back({"uint(j)", xst[axis]});
      for (std::size_t d = axis + 1; d < xs.size(); ++d) t.push_back({cc[d - 1 + is.size()], xst[d]});
      code += index_code(sh, in_buf(1), dot(it), xs[axis]) + copy_from(in_buf(0), dot(t));
      kc.status_message = fmt::format("out of range for extent {} on axis {}", xs[axis], axis);
      break;
    }
    case OpKind::ScatterAdd: {
      // Dispatch 1 copies x; dispatch 2 adds each update at its indexed place.
      code += copy_from(in_buf(0), "i");
      kc.dispatches.push_back(
          {sh.source({kLocal, 1, 1}, "", loop(n, code)), groups_for(std::uint64_t(n), kLocal, c.caps)});
      auto axis = std::size_t(norm_axis(at.get_int("axis"), r));
      const Ints is = body.node(mv->inputs[1]).shape.extents(), us = body.node(mv->inputs[2]).shape.extents();
      const Ints ust = strides_of(us);
      const std::int64_t ni = numel(is);
      if (ni == 0) return kc;
      Shader s2(c);
      Space isp{is, "i", {}};
      std::string add = coords_code(isp, "u");
      std::vector<std::pair<std::string, std::int64_t>> t, ut;
      for (std::size_t d = 0; d < r; ++d) {
        t.push_back({d == axis ? "uint(j)" : isp.coords[d], xst[d]});
        ut.push_back({isp.coords[d], ust[d]});
      }
      add += index_code(s2, in_buf(1), "i", xs[axis]) + "uint t = " + dot(t) + ";\n";
      const DType dt = mv->dtype;
      const std::string v = s2.load(in_buf(2), dot(ut));
      switch (dt) {
        case DType::I32: add += "atomicAdd(" + s2.at(out, "t") + ", " + v + ");\n"; break;
        case DType::I64:
          if (!c.caps.int64_atomics) throw NoShader{"i64 scatter_add needs shaderBufferInt64Atomics"};
          add += "atomicAdd(" + s2.at(out, "t") + ", " + v + ");\n";
          break;
        case DType::F32:
          add += "uint old = " + s2.raw(out, "t") + ";\nfor (;;) {\n  uint prev = atomicCompSwap(" + s2.raw(out, "t") +
                 ", old, floatBitsToUint(uintBitsToFloat(old) + " + v +
                 "));\n  if (prev == old) break;\n  old = prev;\n}\n";
          break;
        case DType::F64:
          if (!c.caps.int64_atomics) throw NoShader{"f64 scatter_add needs shaderBufferInt64Atomics"};
          add += "uint64_t old = " + s2.raw(out, "t") + ";\nfor (;;) {\n  uint64_t prev = atomicCompSwap(" +
                 s2.raw(out, "t") + ", old, doubleBitsToUint64(uint64BitsToDouble(old) + " + v +
                 "));\n  if (prev == old) break;\n  old = prev;\n}\n";
          break;
        default: {
          // 8- and 16-bit elements: compare-and-swap the 32-bit word that holds them.
          const auto size = std::int64_t(ir::dtype_size(dt));
          const std::string w = s2.words(0), mask = size == 1 ? "0xffu" : "0xffffu";
          const CT ct = compute_type(dt);
          std::string unpack = size == 2           ? (dt == DType::F16 ? (s2.use("h2f"), "rlx_h2f(uint16_t(h))")
                                                                       : (s2.use("bf2f"), "rlx_bf2f(uint16_t(h))"))
                               : dt == DType::I8   ? "int(int8_t(h))"
                               : dt == DType::Bool ? "(h != 0u)"
                                                   : "int(h)";
          std::string sum = ct == CT::Bool ? "(" + unpack + " || " + v + ")" : "(" + unpack + " + " + v + ")";
          std::string pack;
          switch (dt) {
            case DType::F16:
              s2.use("f2h");
              pack = "uint(rlx_f2h(" + sum + "))";
              break;
            case DType::BF16:
              s2.use("f2bf");
              pack = "uint(rlx_f2bf(" + sum + "))";
              break;
            case DType::Bool: pack = "(" + sum + " ? 1u : 0u)"; break;
            default: pack = "(uint(" + sum + ") & 0xffu)"; break;
          }
          add += fmt::format(
              "uint byte = {}u + t * {}u, w = byte >> 2, sh = (byte & 3u) * 8u;\n"
              "uint old = {w}[w];\nfor (;;) {{\n  uint h = (old >> sh) & {mask};\n"
              "  uint prev = atomicCompSwap({w}[w], old, (old & ~({mask} << sh)) | ({pack} << sh));\n"
              "  if (prev == old) break;\n  old = prev;\n}}\n",
              s2.byte_offset(out), size, fmt::arg("w", w), fmt::arg("mask", mask), fmt::arg("pack", pack));
        }
      }
      kc.dispatches.push_back(
          {s2.source({kLocal, 1, 1}, "", loop(ni, add)), groups_for(std::uint64_t(ni), kLocal, c.caps)});
      kc.status_message = fmt::format("out of range for extent {} on axis {}", xs[axis], axis);
      return kc;
    }
    default: throw NoShader{"no shader for " + std::string(ir::op_name(mv->op))};
  }
  kc.dispatches.push_back({sh.source({kLocal, 1, 1}, "", loop(n, code)), groups_for(std::uint64_t(n), kLocal, c.caps)});
  return kc;
}

}  // namespace rlx::backends::vulkan
#endif
