#ifdef RLX_HAVE_VULKAN
// Reduce kernels: the prologue is evaluated at each reduced input point, the
// anchor accumulates (in f32/f64 for floats, int64 for integers), and the
// epilogue runs on the result at the output point. Short reductions take one
// thread per output; long ones a workgroup per output with a tree in shared
// memory.
#include <fmt/format.h>

#include <cmath>

#include "backends/vulkan/codegen.hpp"

namespace rlx::backends::vulkan {

using ir::DType;
using ir::OpKind;

namespace {

constexpr std::uint32_t kWg = 256;
constexpr std::int64_t kThreadPerOutputMax = 128;

}  // namespace

KernelCode gen_reduce(const GenCtx& c) {
  const auto& k = c.kernel;
  const ir::Graph& body = k.body;
  const ir::Node* anchor = nullptr;
  for (const auto& n : body.nodes())
    if (ir::op_info(n.op).cls == ir::OpClass::Reduce) anchor = &n;
  if (!anchor || k.outputs.size() != 1) throw NoShader{"not a reduce kernel"};
  const ir::Node& x = body.node(anchor->inputs[0]);
  const auto in_shape = x.shape.extents();
  const auto out_shape = anchor->shape.extents();
  const std::size_t rank = in_shape.size();
  const bool arg = anchor->op == OpKind::ArgMax || anchor->op == OpKind::ArgMin;

  std::vector<bool> reduced(rank, false);
  if (arg) {
    if (rank > 0) {
      auto a = anchor->attrs.get_int("axis");
      reduced[std::size_t(a < 0 ? a + std::int64_t(rank) : a)] = true;
    }
  } else {
    for (auto a : anchor->attrs.get_ints("axes")) reduced[std::size_t(a < 0 ? a + std::int64_t(rank) : a)] = true;
  }
  std::vector<std::int64_t> kept_ext, red_ext;
  std::vector<std::string> kept_names, red_names, coords(rank);
  std::vector<std::int64_t> strides(rank, 1);
  for (std::size_t d = rank; d-- > 1;) strides[d - 1] = strides[d] * in_shape[d];
  for (std::size_t d = 0; d < rank; ++d) {
    coords[d] = "x" + std::to_string(d);
    (reduced[d] ? red_ext : kept_ext).push_back(in_shape[d]);
    (reduced[d] ? red_names : kept_names).push_back(coords[d]);
  }
  std::int64_t O = 1, R = 1;
  for (auto e : kept_ext) O *= e;
  for (auto e : red_ext) R *= e;
  if (O == 0) return {};
  if (arg && R == 0) throw NoShader{"argmax/argmin over an empty axis"};

  Shader sh(c);
  const CT vt = compute_type(x.dtype);  // the reduced values' compute type
  const bool fl = vt == CT::F32 || vt == CT::F64;
  const std::string val_t(ct_name(vt));
  const std::string acc_t = fl ? val_t : "int64_t";
  auto lit = [&](double v) { return literal(v, vt == CT::F64 ? DType::F64 : vt == CT::F32 ? DType::F32 : DType::I64); };
  const bool is_max = anchor->op == OpKind::ReduceMax || anchor->op == OpKind::ArgMax;
  std::string init;
  switch (anchor->op) {
    case OpKind::ReduceSum:
    case OpKind::ReduceMean: init = lit(0); break;
    case OpKind::ReduceProd: init = lit(1); break;
    default:
      init = fl ? lit(is_max ? -INFINITY : INFINITY)
                : (is_max ? "int64_t(0x8000000000000000ul)" : "int64_t(0x7ffffffffffffffful)");
  }
  const std::string cmp = is_max ? ">" : "<";

  // One step of the sequential accumulation of value `v` at reduction index `r`.
  std::string step;
  switch (anchor->op) {
    case OpKind::ReduceSum:
    case OpKind::ReduceMean: step = "acc += " + acc_t + "(v);\n"; break;
    case OpKind::ReduceProd: step = "acc *= " + acc_t + "(v);\n"; break;
    case OpKind::ReduceMax:
    case OpKind::ReduceMin:
      step = fl ? "if (!isnan(acc) && (isnan(v) || v " + cmp + " acc)) acc = v;\n"
                : "acc = " + std::string(is_max ? "max" : "min") + "(acc, int64_t(v));\n";
      break;
    default:
      // bi < 0 until the first element, which is always taken.
      step = fl ? "if (bi < 0l || (!isnan(acc) && (isnan(v) || v " + cmp + " acc))) { acc = v; bi = int64_t(r); }\n"
                : "if (bi < 0l || int64_t(v) " + cmp + " acc) { acc = int64_t(v); bi = int64_t(r); }\n";
  }

  // The prologue at input point (kept coords from o, reduced coords from r).
  Space in_sp{in_shape, "xl", coords};
  std::string lin;
  for (std::size_t d = 0; d < rank; ++d)
    lin += (lin.empty() ? "" : " + ") + coords[d] + (strides[d] == 1 ? "" : " * " + u(strides[d]));
  Emitter pro(sh, body, in_sp, "p");
  std::string pv = pro.value(x.id);
  std::string inner = declare_coords("r", red_ext, red_names) + "uint xl = " + (lin.empty() ? "0u" : lin) + ";\n" +
                      pro.take_code() + val_t + " v = " + pv + ";\n" + step;

  // The result in the anchor's compute type, then the epilogue at the output point.
  std::string result;
  const DType dt = anchor->dtype;
  switch (anchor->op) {
    case OpKind::ArgMax:
    case OpKind::ArgMin: result = "bi"; break;
    case OpKind::ReduceMean: result = R == 0 ? literal(NAN, dt) : sh.narrow("acc / " + lit(double(R)), dt); break;
    default: result = fl ? sh.narrow("acc", dt) : sh.convert("acc", DType::I64, dt);
  }
  Space out_sp{out_shape, "o", {}};
  std::string epi = coords_code(out_sp, "y");
  Emitter em(sh, body, out_sp, "e");
  em.preset(anchor->id, "res");
  std::string ov = em.value(body.outputs()[0].node);
  epi = std::string(ct_name(compute_type(dt))) + " res = " + result + ";\n" + epi + em.take_code() +
        sh.store(k.outputs[0], "o", ov);

  const std::string acc_decl = acc_t + " acc = " + init + ";\n" + (arg ? "int64_t bi = -1l;\n" : "");
  if (R <= kThreadPerOutputMax) {
    std::string main = fmt::format(
        "uint rlx_n = gl_NumWorkGroups.x * {}u;\nfor (uint o = gl_GlobalInvocationID.x; o < {}; o += rlx_n) {{\n{}{}"
        "for (uint r = 0u; r < {}; ++r) {{\n{}}}\n{}}}\n",
        kWg, u(O), declare_coords("o", kept_ext, kept_names), acc_decl, u(R), inner, epi);
    return {{{sh.source({kWg, 1, 1}, "", main), groups_for(std::uint64_t(O), kWg, c.caps)}}, {}};
  }
  // A workgroup per output: strided partial results, then a tree over shared memory.
  std::string merge;
  switch (anchor->op) {
    case OpKind::ReduceSum:
    case OpKind::ReduceMean: merge = "s_acc[l] += s_acc[l + s];\n"; break;
    case OpKind::ReduceProd: merge = "s_acc[l] *= s_acc[l + s];\n"; break;
    case OpKind::ReduceMax:
    case OpKind::ReduceMin:
      merge = fl ? "if (!isnan(s_acc[l]) && (isnan(s_acc[l + s]) || s_acc[l + s] " + cmp +
                       " s_acc[l])) s_acc[l] = s_acc[l + s];\n"
                 : "s_acc[l] = " + std::string(is_max ? "max" : "min") + "(s_acc[l], s_acc[l + s]);\n";
      break;
    default:
      // The first extreme wins: on a tie (or two NaNs) the lower index; a NaN beats any number.
      merge = fl ? fmt::format(
                       "{{ {0} a = s_acc[l], b = s_acc[l + s]; int64_t ia = s_idx[l], ib = s_idx[l + s];\n"
                       "if ((isnan(b) && (!isnan(a) || ib < ia)) || (!isnan(a) && !isnan(b) && (b {1} a || (b == a && "
                       "ib < ia)))) "
                       "{{ s_acc[l] = b; s_idx[l] = ib; }} }}\n",
                       acc_t, cmp)
                 : fmt::format(
                       "{{ int64_t a = s_acc[l], b = s_acc[l + s]; int64_t ia = s_idx[l], ib = s_idx[l + s];\n"
                       "if (b {0} a || (b == a && ib < ia)) {{ s_acc[l] = b; s_idx[l] = ib; }} }}\n",
                       cmp);
  }
  std::string decls =
      fmt::format("shared {} s_acc[{}];\n", acc_t, kWg) + (arg ? fmt::format("shared int64_t s_idx[{}];\n", kWg) : "");
  std::string main = fmt::format(
      "uint l = gl_LocalInvocationID.x;\n"
      "for (uint o = gl_WorkGroupID.x; o < {0}; o += gl_NumWorkGroups.x) {{\n{1}{2}"
      "for (uint r = l; r < {3}; r += {4}u) {{\n{5}}}\n"
      "s_acc[l] = acc;\n{6}barrier();\n"
      "for (uint s = {7}u; s > 0u; s >>= 1) {{\nif (l < s) {8}barrier();\n}}\n"
      "if (l == 0u) {{\nacc = s_acc[0];\n{9}{10}}}\nbarrier();\n}}\n",
      u(O), declare_coords("o", kept_ext, kept_names), acc_decl, u(R), kWg, inner,
      arg ? "s_idx[l] = bi < 0l ? int64_t(0x7ffffffffffffffful) : bi;\n" : "", kWg / 2, merge,
      arg ? "bi = s_idx[0];\n" : "", epi);
  // Threads that saw no element hold the identity and, for arg, the largest index, so they never win a tie.
  return {{{sh.source({kWg, 1, 1}, decls, main), groups_for(std::uint64_t(O) * kWg, kWg, c.caps)}}, {}};
}

}  // namespace rlx::backends::vulkan
#endif
