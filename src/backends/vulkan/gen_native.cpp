#ifdef RLX_HAVE_VULKAN
// Native composites, in f32 or f64 (f16/bf16 are legalized to f32 around
// them). Row ops (softmax, log_softmax, layer_norm, rms_norm) take a workgroup
// per row with tree reductions in shared memory. f32 conv is an implicit GEMM
// on the small-matmul tiles; f64 conv and pools take one thread per output
// element. f32 attention is flash attention (attention_tiled); otherwise a
// workgroup per query row. Both stream over the keys with a running max and
// sum (the online softmax), so any key length fits in shared memory.
#include <fmt/format.h>

#include <cmath>

#include "backends/vulkan/codegen.hpp"

namespace rlx::backends::vulkan {

using ir::DType;
using ir::OpKind;
using Ints = std::vector<std::int64_t>;

namespace {

// Names and constants of one real type (float or double).
struct Real {
  bool dbl;
  Shader& sh;
  std::string t() const { return dbl ? "double" : "float"; }
  std::string k(double v) const { return literal(v, dbl ? DType::F64 : DType::F32); }
  std::string exp(const std::string& x) const {
    if (!dbl) return "exp(" + x + ")";
    sh.use("d_exp");
    return "rlx_exp(" + x + ")";
  }
  std::string log(const std::string& x) const {
    if (!dbl) return "log(" + x + ")";
    sh.use("d_log");
    return "rlx_log(" + x + ")";
  }
};

// A tree reduction of `v` over the workgroup into red[0]; `op` combines "a" and "b".
std::string tree(std::uint32_t wg, const std::string& v, const std::string& op) {
  return fmt::format(
      "red[l] = {};\nbarrier();\nfor (uint s = {}u; s > 0u; s >>= 1) {{\n  if (l < s) {{ {} a = red[l], b = red[l + "
      "s]; red[l] = {}; }}\n"
      "  barrier();\n}}\n",
      v, wg / 2, "REAL", op);
}

std::string finish_tree(std::string code, const Real& r) {
  for (std::size_t p; (p = code.find("REAL")) != std::string::npos;) code.replace(p, 4, r.t());
  return code;
}

struct AttentionBuffers {
  compile::BufferId q, k, v, out;
};
struct AttentionDims {
  std::int64_t batch, sq, sk, d, dv;
};

// f32 attention as flash attention: a workgroup takes BQ queries of one batch
// entry and streams over the keys BK at a time, through shared memory. Per
// key tile: S = Q K^T (each thread a 4 x 4 block), the online softmax over
// S's rows (two threads a row), then O = O * alpha + P V (each thread 4 rows
// of O). Every key is read once per BQ queries, where the row kernel below
// reads it once per query. Loads past the end read the last row and are then
// replaced by zero: a load inside a branch is not issued ahead with the
// others, which on an H200 made the tile loads a chain of memory round trips.
// `mask` (may be empty) is the row kernel's mask code: it reads z, qi and j
// and adjusts sc.
std::optional<KernelCode> attention_tiled(const GenCtx& c, Shader& sh, AttentionBuffers b, AttentionDims n,
                                          double scale, bool causal, const std::string& mask) {
  constexpr std::uint32_t BK = 32;
  if (n.d % 4 || n.dv % 4 || n.d > 256 || n.dv > 256) return std::nullopt;
  auto shared_bytes = [&](std::uint32_t bq) {
    return 4 * (n.d * bq + n.d * BK + BK * n.dv + bq * (BK + 1) + 2 * 2 * bq + 3 * bq);
  };
  // 64 queries a workgroup, or 32 when that leaves an H200's SMs idle or does not fit.
  const std::int64_t blocks64 = n.batch * ((n.sq + 63) / 64);
  std::uint32_t BQ = blocks64 >= 128 && shared_bytes(64) <= c.caps.max_shared_bytes ? 64 : 32;
  if (shared_bytes(BQ) > c.caps.max_shared_bytes || 2 * BQ > c.caps.max_invocations) return std::nullopt;
  const std::uint32_t NT = 2 * BQ;  // threads: (BQ / 4) x 8
  const std::int64_t dv4 = n.dv / 4, nj = (dv4 + 7) / 8;
  const bool guard_c = dv4 % 8 != 0;
  const std::int64_t nblk = (n.sq + BQ - 1) / BQ;
  static constexpr const char* kXyzw[] = {"x", "y", "z", "w"};

  std::string scores, init_o, rescale, accum, store;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j)
      scores += fmt::format(
          "  {{ uint qi = q0 + ty * 4u + {i}u, j = k0 + tx * 4u + {j}u;\n"
          "    float sc = -1.0 / 0.0;\n"
          "    if (qi < {Sq} && j < {Sk}) {{\n      sc = s{i}.{c} * {scale};\n{causal}{mask}    }}\n"
          "    Ss[ty * 4u + {i}u][tx * 4u + {j}u] = sc; }}\n",
          fmt::arg("i", i), fmt::arg("j", j), fmt::arg("c", kXyzw[j]), fmt::arg("Sq", u(n.sq)), fmt::arg("Sk", u(n.sk)),
          fmt::arg("scale", literal(scale, DType::F32)),
          fmt::arg("causal", causal ? "      if (j > qi) sc = -1.0 / 0.0;\n" : ""), fmt::arg("mask", mask));
  for (int i = 0; i < 4; ++i) {
    rescale += fmt::format("  float a{0} = As[ty * 4u + {0}u];\n", i);
    for (std::int64_t jj = 0; jj < nj; ++jj) {
      init_o += fmt::format("vec4 o{}_{} = vec4(0.0);\n", i, jj);
      rescale += fmt::format("  o{0}_{1} *= a{0};\n", i, jj);
    }
  }
  accum =
      "    float p0 = Ss[ty * 4u][kk], p1 = Ss[ty * 4u + 1u][kk], p2 = Ss[ty * 4u + 2u][kk], p3 = Ss[ty * 4u + "
      "3u][kk];\n";
  for (std::int64_t jj = 0; jj < nj; ++jj) {
    accum += fmt::format("    {{ vec4 v = Vs[kk][{}]; ", guard_c ? fmt::format("min(tx + {}u, {}u)", 8 * jj, dv4 - 1)
                                                                 : fmt::format("tx + {}u", 8 * jj));
    for (int i = 0; i < 4; ++i) accum += fmt::format("o{0}_{1} = fma(vec4(p{0}), v, o{0}_{1}); ", i, jj);
    accum += "}\n";
  }
  for (int i = 0; i < 4; ++i) {
    store += fmt::format("{{ uint qi = q0 + ty * 4u + {0}u; float il = 1.0 / Ls[ty * 4u + {0}u];\nif (qi < {1}) {{\n",
                         i, u(n.sq));
    for (std::int64_t jj = 0; jj < nj; ++jj) {
      store += fmt::format("  {{ uint cq = tx + {}u;\n  if (cq < {}u) {{\n", 8 * jj, dv4);
      for (int e = 0; e < 4; ++e)
        store += "    " + sh.store(b.out, fmt::format("(z * {} + qi) * {} + cq * 4u + {}u", u(n.sq), u(n.dv), e),
                                   fmt::format("o{}_{}.{} * il", i, jj, kXyzw[e]));
      store += "  } }\n";
    }
    store += "} }\n";
  }
  std::string main = fmt::format(
      "uint tid = gl_LocalInvocationID.x, ty = tid >> 3, tx = tid & 7u, r = tid >> 1, h = tid & 1u;\n"
      "for (uint blk = gl_WorkGroupID.x; blk < {nblk}; blk += gl_NumWorkGroups.x) {{\n"
      "uint z = blk / {qblocks}, q0 = (blk % {qblocks}) * {BQ}u;\n"
      "[[unroll]] for (uint e = tid; e < {BQ}u * {D}; e += {NT}u) {{\n"
      "  uint row = e % {BQ}u, d = e / {BQ}u, qi = q0 + row;\n"
      "  float v = {qload};\n  Qs[d][row >> 2][row & 3u] = qi < {Sq} ? v : 0.0;\n}}\n"
      "if (tid < {BQ}u) {{ Ms[tid] = -1.0 / 0.0; Ls[tid] = 0.0; }}\n"
      "{init_o}"
      "uint kend = {kend};\n"
      "for (uint k0 = 0u; k0 < kend; k0 += {BK}u) {{\n"
      "  [[unroll]] for (uint e = tid; e < {BK}u * {D}; e += {NT}u) {{\n"
      "    uint key = e % {BK}u, d = e / {BK}u, j = k0 + key;\n"
      "    float v = {kload};\n    Ks[d][key >> 2][key & 3u] = j < {Sk} ? v : 0.0;\n  }}\n"
      "  [[unroll]] for (uint e = tid; e < {BK}u * {Dv}; e += {NT}u) {{\n"
      "    uint key = e / {Dv}, dd = e % {Dv}, j = k0 + key;\n"
      "    float v = {vload};\n    Vs[key][dd >> 2][dd & 3u] = j < {Sk} ? v : 0.0;\n  }}\n"
      "  barrier();\n"
      "  vec4 s0 = vec4(0.0), s1 = vec4(0.0), s2 = vec4(0.0), s3 = vec4(0.0);\n"
      "  for (uint d = 0u; d < {D}; ++d) {{\n"
      "    vec4 q = Qs[d][ty], kv = Ks[d][tx];\n"
      "    s0 = fma(vec4(q.x), kv, s0); s1 = fma(vec4(q.y), kv, s1); s2 = fma(vec4(q.z), kv, s2); s3 = fma(vec4(q.w), "
      "kv, s3);\n"
      "  }}\n"
      "{scores}"
      "  barrier();\n"
      // The online softmax: row r's running max Ms and sum Ls, and the factor As for the rows' old output.
      "  float mx = -1.0 / 0.0;\n"
      "  [[unroll]] for (uint jj = 0u; jj < {HALF}u; ++jj) mx = max(mx, Ss[r][h * {HALF}u + jj]);\n"
      "  Red[tid] = mx;\n"
      "  barrier();\n"
      "  float mold = Ms[r], mn = max(mold, max(Red[r * 2u], Red[r * 2u + 1u])), ps = 0.0;\n"
      "  [[unroll]] for (uint jj = 0u; jj < {HALF}u; ++jj) {{\n"
      "    float p = mn == -1.0 / 0.0 ? 0.0 : exp(Ss[r][h * {HALF}u + jj] - mn);\n"
      "    Ss[r][h * {HALF}u + jj] = p; ps += p;\n  }}\n"
      "  Red2[tid] = ps;\n"
      "  barrier();\n"
      "  if (h == 0u) {{\n"
      "    float alpha = mn == -1.0 / 0.0 ? 1.0 : exp(mold - mn);\n"
      "    Ls[r] = Ls[r] * alpha + Red2[r * 2u] + Red2[r * 2u + 1u]; Ms[r] = mn; As[r] = alpha;\n  }}\n"
      "  barrier();\n"
      "{rescale}"
      "  [[unroll]] for (uint kk = 0u; kk < {BK}u; ++kk) {{\n{accum}  }}\n"
      "  barrier();\n"
      "}}\n"
      "{store}"
      "barrier();\n"
      "}}\n",
      fmt::arg("nblk", u(n.batch * nblk)), fmt::arg("qblocks", u(nblk)), fmt::arg("BQ", BQ), fmt::arg("BK", BK),
      fmt::arg("NT", NT), fmt::arg("D", u(n.d)), fmt::arg("Dv", u(n.dv)), fmt::arg("Sq", u(n.sq)),
      fmt::arg("Sk", u(n.sk)), fmt::arg("HALF", BK / 2), fmt::arg("init_o", init_o), fmt::arg("scores", scores),
      fmt::arg("rescale", rescale), fmt::arg("accum", accum), fmt::arg("store", store),
      fmt::arg("kend", causal ? fmt::format("min({}, q0 + {}u)", u(n.sk), BQ) : u(n.sk)),
      fmt::arg("qload", sh.load(b.q, "(z * " + u(n.sq) + " + min(qi, " + u(n.sq - 1) + ")) * " + u(n.d) + " + d")),
      fmt::arg("kload", sh.load(b.k, "(z * " + u(n.sk) + " + min(j, " + u(n.sk - 1) + ")) * " + u(n.d) + " + d")),
      fmt::arg("vload", sh.load(b.v, "(z * " + u(n.sk) + " + min(j, " + u(n.sk - 1) + ")) * " + u(n.dv) + " + dd")));
  std::string decls = fmt::format(
      "shared vec4 Qs[{D}][{BQ4}];\nshared vec4 Ks[{D}][{BK4}];\nshared vec4 Vs[{BK}][{Dv4}];\nshared float "
      "Ss[{BQ}][{BK1}];\n"
      "shared float Red[{NT}], Red2[{NT}], Ms[{BQ}], Ls[{BQ}], As[{BQ}];\n",
      fmt::arg("D", n.d), fmt::arg("BQ4", BQ / 4), fmt::arg("BK4", BK / 4), fmt::arg("BK", BK), fmt::arg("Dv4", dv4),
      fmt::arg("BQ", BQ), fmt::arg("BK1", BK + 1), fmt::arg("NT", NT));
  const auto groups = std::uint32_t(std::min<std::int64_t>(n.batch * nblk, c.caps.max_groups[0]));
  return KernelCode{{{sh.source({NT, 1, 1}, decls, main), {groups, 1, 1}}}, {}};
}

}  // namespace

KernelCode gen_native(const GenCtx& c) {
  const auto& k = c.kernel;
  const ir::Graph& body = k.body;
  const ir::Node* op = nullptr;
  for (const auto& n : body.nodes())
    if (n.op != OpKind::Input) op = &n;
  if (!op || k.outputs.size() != 1 || op->op == OpKind::Custom) throw NoShader{"no shader for this native kernel"};
  if (op->dtype != DType::F32 && op->dtype != DType::F64) throw NoShader{"native kernels run in f32 or f64"};
  const compile::BufferId out = k.outputs[0];
  const Ints os = op->shape.extents();
  if (numel(os) == 0) return {};
  auto in = [&](std::size_t i) { return k.input_buffer(body.node(op->inputs.at(i))); };
  auto has = [&](std::size_t i) { return op->inputs.size() > i; };
  const Ints xs = body.node(op->inputs[0]).shape.extents();
  const auto& at = op->attrs;
  Shader sh(c);
  const Real R{op->dtype == DType::F64, sh};
  const std::string T = R.t();

  switch (op->op) {
    case OpKind::Softmax:
    case OpKind::LogSoftmax:
    case OpKind::LayerNorm:
    case OpKind::RmsNorm: {
      // rows x L elements, element j of row r at base(r) + j * inner.
      std::int64_t outer = 1, L = 1, inner = 1;
      std::size_t axis = xs.size() - 1;
      if (op->op == OpKind::Softmax || op->op == OpKind::LogSoftmax || op->op == OpKind::LayerNorm) {
        auto a = at.get_int("axis");
        axis = std::size_t(a < 0 ? a + std::int64_t(xs.size()) : a);
      }
      const bool norm = op->op == OpKind::LayerNorm || op->op == OpKind::RmsNorm;
      for (std::size_t d = 0; d < xs.size(); ++d) {
        if (d < axis)
          outer *= xs[d];
        else if (d == axis || norm)
          L *= xs[d];
        else
          inner *= xs[d];
      }
      const std::uint32_t wg = L > 512 ? 256 : 64;
      const std::int64_t rows = outer * inner;
      const std::string base =
          inner == 1 ? "row * " + u(L) : "(row / " + u(inner) + ") * " + u(L * inner) + " + row % " + u(inner);
      auto x = [&](const std::string& j) {
        return sh.load(in(0), "base + " + j + (inner == 1 ? "" : " * " + u(inner)));
      };
      auto y = [&](const std::string& j, const std::string& v) {
        return sh.store(out, "base + " + j + (inner == 1 ? "" : " * " + u(inner)), v);
      };
      // Each pass runs `body` at every element j of the thread's share of the row, its value in xv. Rows of
      // at most 16 elements a thread are read once, into registers, before the first pass (indices past the
      // row clamped, so every load is issued at once; the passes skip those lanes); longer rows loop.
      const std::int64_t per_thread = (L + wg - 1) / wg;
      const bool resident = per_thread <= 16;
      std::string body_code;
      if (resident)
        for (std::int64_t t = 0; t < per_thread; ++t)
          body_code += fmt::format("uint j{0} = l + {1}u;\n{2} xr{0} = {3};\n", t, t * wg, T,
                                   x("min(j" + std::to_string(t) + ", " + u(L - 1) + ")"));
      auto each = [&](const std::string& body) {
        if (!resident)
          return fmt::format("for (uint j = l; j < {}; j += {}u) {{\n{} xv = {};\n{}}}\n", u(L), wg, T, x("j"), body);
        std::string code;
        for (std::int64_t t = 0; t < per_thread; ++t) {
          const bool whole = (t + 1) * std::int64_t(wg) <= L;  // every thread's element is in the row
          code += fmt::format("{{ uint j = j{0}; {1} xv = xr{0};\n{2}{3}{4}}}\n", t, T,
                              whole ? "" : "if (j < " + u(L) + ") {\n", body, whole ? "" : "}\n");
        }
        return code;
      };
      if (op->op == OpKind::Softmax || op->op == OpKind::LogSoftmax) {
        body_code += fmt::format("{} m = {};\n", T, R.k(-INFINITY)) + each("m = max(m, xv);\n") +
                     tree(wg, "m", "max(a, b)") + "m = red[0];\nbarrier();\n" + fmt::format("{} s = {};\n", T, R.k(0)) +
                     each("s += " + R.exp("xv - m") + ";\n") + tree(wg, "s", "a + b") + "s = red[0];\nbarrier();\n" +
                     each(y("j", op->op == OpKind::Softmax ? R.exp("xv - m") + " / s" : "(xv - m) - " + R.log("s")));
      } else {
        const bool ln = op->op == OpKind::LayerNorm;
        const double eps = at.get_float("eps");
        std::string scale = has(1) ? " * " + sh.load(in(1), "j") : "";
        std::string shift = ln && has(2) ? " + " + sh.load(in(2), "j") : "";
        if (ln)
          body_code += fmt::format("{} s = {};\n", T, R.k(0)) + each("s += xv;\n") + tree(wg, "s", "a + b") +
                       fmt::format("{} mean = red[0] / {};\nbarrier();\n", T, R.k(double(L)));
        else
          body_code += fmt::format("{} mean = {};\n", T, R.k(0));
        body_code +=
            fmt::format("{} q = {};\n", T, R.k(0)) + each(T + " d = xv - mean;\nq += d * d;\n") +
            tree(wg, "q", "a + b") +
            fmt::format("{} rs = {} / sqrt(red[0] / {} + {});\nbarrier();\n", T, R.k(1), R.k(double(L)), R.k(eps)) +
            each(y("j", "(xv - mean) * rs" + scale + shift));
      }
      std::string main = fmt::format(
          "uint l = gl_LocalInvocationID.x;\nfor (uint row = gl_WorkGroupID.x; row < {}; row += gl_NumWorkGroups.x) "
          "{{\nuint base = {};\n{}}}\n",
          u(rows), base, body_code);
      std::string decls = fmt::format("shared {} red[{}];\n", T, wg);
      return {{{sh.source({wg, 1, 1}, decls, finish_tree(main, R)), groups_for(std::uint64_t(rows) * wg, wg, c.caps)}},
              {}};
    }

    case OpKind::Conv1d:
    case OpKind::Conv2d: {
      const bool one = op->op == OpKind::Conv1d;
      const Ints ws = body.node(op->inputs[1]).shape.extents();
      auto pair = [&](const char* key, std::int64_t dflt) {
        Ints v = at.has(key) ? at.get_ints(key) : Ints{};
        if (one) return Ints{dflt == 0 ? 0 : 1, v.empty() ? dflt : v[0]};  // conv1d is conv2d with H = 1
        if (v.size() == 1) v.push_back(v[0]);
        return v.empty() ? Ints{dflt, dflt} : v;
      };
      const Ints st = pair("stride", 1), pd = pair("padding", 0), dl = pair("dilation", 1);
      const std::int64_t N = xs[0], C = xs[1], H = one ? 1 : xs[2], W = xs.back(), O = ws[0], Cg = ws[1];
      const std::int64_t KH = one ? 1 : ws[2], KW = ws.back(), OH = one ? 1 : os[2], OW = os.back();
      const std::int64_t G = at.int_or("groups", 1), per = O / G;
      const std::int64_t total = N * O * OH * OW;
      const std::int64_t P = OH * OW, CK = Cg * KH * KW;
      if (!R.dbl && std::uint64_t((P + 31) / 32) <= c.caps.max_groups[0] &&
          std::uint64_t((per + 31) / 32) <= c.caps.max_groups[1] && std::uint64_t(N * G) <= c.caps.max_groups[2]) {
        // f32: an implicit GEMM per (image, group), y[o, p] = w[o, (c, kh, kw)] x im2col[(c, kh, kw), p], on
        // the small-matmul tiles, with im2col computed as B's tiles load (clamped, then zero outside the image).
        const std::string a_code = fmt::format("v = {}; v = (gm < {} && gk < {}) ? v : 0.0;",
                                               sh.load(in(1), "(grp * " + u(per) + " + min(gm, " + u(per - 1) +
                                                                  ")) * " + u(CK) + " + min(gk, " + u(CK - 1) + ")"),
                                               u(per), u(CK));
        const std::string b_code = fmt::format(
            "uint kc = min(gk, {CK1}), pc = min(gn, {P1}), ch = kc / {KHW}, r = kc % {KHW};\n"
            "    int ih = int(pc / {OW}) * {sh} - {ph} + int(r / {KW}) * {dh}, iw = int(pc % {OW}) * {sw} - {pw} + "
            "int(r % {KW}) * {dw};\n"
            "    v = {xv};\n"
            "    v = (gk < {CK} && gn < {P} && ih >= 0 && ih < {H} && iw >= 0 && iw < {W}) ? v : 0.0;",
            fmt::arg("CK1", u(CK - 1)), fmt::arg("P1", u(P - 1)), fmt::arg("KHW", u(KH * KW)), fmt::arg("OW", u(OW)),
            fmt::arg("KW", u(KW)), fmt::arg("sh", st[0]), fmt::arg("sw", st[1]), fmt::arg("ph", pd[0]),
            fmt::arg("pw", pd[1]), fmt::arg("dh", dl[0]), fmt::arg("dw", dl[1]), fmt::arg("CK", u(CK)),
            fmt::arg("P", u(P)), fmt::arg("H", H), fmt::arg("W", W),
            fmt::arg("xv", sh.load(in(0), "((img * " + u(C) + " + grp * " + u(Cg) + " + ch) * " + u(H) +
                                              " + uint(clamp(ih, 0, " + std::to_string(H - 1) + "))) * " + u(W) +
                                              " + uint(clamp(iw, 0, " + std::to_string(W - 1) + "))")));
        const std::string result = sh.store(out, "(img * " + u(O) + " + grp * " + u(per) + " + m) * " + u(P) + " + n",
                                            has(2) ? "acc + " + sh.load(in(2), "grp * " + u(per) + " + m") : "acc");
        std::string main =
            fmt::format("uint img = gl_WorkGroupID.z / {0}, grp = gl_WorkGroupID.z % {0}, k0 = 0u;\n", u(G)) +
            tile32_main(per, P, CK, scalar_tile_loads(a_code, b_code), result);
        return {{{sh.source({256, 1, 1}, kTile32Shared, main),
                  {std::uint32_t((P + 31) / 32), std::uint32_t((per + 31) / 32), std::uint32_t(N * G)}}},
                {}};
      }
      std::string main = fmt::format(
          "uint rlx_n = gl_NumWorkGroups.x * 256u;\n"
          "for (uint i = gl_GlobalInvocationID.x; i < {total}; i += rlx_n) {{\n"
          "  int ow = int(i % {OW}), oh = int((i / {OW}) % {OH}); uint o = (i / {OHW}) % {O}, n = i / {OOHW};\n"
          "  {T} acc = {bias};\n"
          "  uint ch0 = (o / {per}) * {Cg};\n"
          "  for (uint ci = 0u; ci < {Cg}; ++ci)\n"
          "    for (int kh = 0; kh < {KH}; ++kh) {{\n"
          "      int ih = oh * {sh} - {ph} + kh * {dh};\n"
          "      if (ih < 0 || ih >= {H}) continue;\n"
          "      for (int kw = 0; kw < {KW}; ++kw) {{\n"
          "        int iw = ow * {sw} - {pw} + kw * {dw};\n"
          "        if (iw < 0 || iw >= {W}) continue;\n"
          "        acc += {xv} * {wv};\n"
          "      }}\n"
          "    }}\n"
          "  {store}}}\n",
          fmt::arg("total", u(total)), fmt::arg("OW", u(OW)), fmt::arg("OH", u(OH)), fmt::arg("OHW", u(OH * OW)),
          fmt::arg("O", u(O)), fmt::arg("OOHW", u(O * OH * OW)), fmt::arg("T", T),
          fmt::arg("bias", has(2) ? sh.load(in(2), "o") : R.k(0)), fmt::arg("per", u(per)), fmt::arg("Cg", u(Cg)),
          fmt::arg("KH", KH), fmt::arg("KW", KW), fmt::arg("H", H), fmt::arg("W", W), fmt::arg("sh", st[0]),
          fmt::arg("sw", st[1]), fmt::arg("ph", pd[0]), fmt::arg("pw", pd[1]), fmt::arg("dh", dl[0]),
          fmt::arg("dw", dl[1]),
          fmt::arg("xv", sh.load(in(0), "((n * " + u(C) + " + ch0 + ci) * " + u(H) + " + uint(ih)) * " + u(W) +
                                            " + uint(iw)")),
          fmt::arg("wv",
                   sh.load(in(1), "((o * " + u(Cg) + " + ci) * " + u(KH) + " + uint(kh)) * " + u(KW) + " + uint(kw)")),
          fmt::arg("store", sh.store(out, "i", "acc")));
      return {{{sh.source({256, 1, 1}, "", main), groups_for(std::uint64_t(total), 256, c.caps)}}, {}};
    }

    case OpKind::MaxPool2d:
    case OpKind::AvgPool2d: {
      const bool mx = op->op == OpKind::MaxPool2d;
      const Ints kr = at.get_ints("kernel"), st = at.has("stride") ? at.get_ints("stride") : kr,
                 pd = at.has("padding") ? at.get_ints("padding") : Ints{0, 0};
      const std::int64_t H = xs[xs.size() - 2], W = xs.back(), OH = os[os.size() - 2], OW = os.back();
      const std::int64_t total = numel(os);
      std::string accum = mx ? "if (!isnan(acc) && (isnan(v) || v > acc)) acc = v;" : "acc += v;";
      std::string main = fmt::format(
          "uint rlx_n = gl_NumWorkGroups.x * 256u;\n"
          "for (uint i = gl_GlobalInvocationID.x; i < {total}; i += rlx_n) {{\n"
          "  int ow = int(i % {OW}), oh = int((i / {OW}) % {OH}); uint p = i / {OHW};\n"
          "  {T} acc = {init};\n"
          "  for (int kh = 0; kh < {KH}; ++kh) {{\n"
          "    int h = oh * {sh} - {ph} + kh;\n"
          "    if (h < 0 || h >= {H}) continue;\n"
          "    for (int kw = 0; kw < {KW}; ++kw) {{\n"
          "      int w = ow * {sw} - {pw} + kw;\n"
          "      if (w < 0 || w >= {W}) continue;\n"
          "      {T} v = {xv};\n      {accum}\n"
          "    }}\n  }}\n"
          "  {store}}}\n",
          fmt::arg("total", u(total)), fmt::arg("OW", u(OW)), fmt::arg("OH", u(OH)), fmt::arg("OHW", u(OH * OW)),
          fmt::arg("T", T), fmt::arg("init", R.k(mx ? -INFINITY : 0)), fmt::arg("KH", kr[0]), fmt::arg("KW", kr[1]),
          fmt::arg("sh", st[0]), fmt::arg("sw", st[1]), fmt::arg("ph", pd[0]), fmt::arg("pw", pd[1]), fmt::arg("H", H),
          fmt::arg("W", W), fmt::arg("xv", sh.load(in(0), "(p * " + u(H) + " + uint(h)) * " + u(W) + " + uint(w)")),
          fmt::arg("accum", accum),
          fmt::arg("store", sh.store(out, "i", mx ? "acc" : "acc / " + R.k(double(kr[0] * kr[1])))));
      return {{{sh.source({256, 1, 1}, "", main), groups_for(std::uint64_t(total), 256, c.caps)}}, {}};
    }

    case OpKind::Attention: {
      const Ints& qs = xs;
      const Ints ks = body.node(op->inputs[1]).shape.extents(), vs = body.node(op->inputs[2]).shape.extents();
      const std::size_t r2 = qs.size() - 2;
      if (!std::equal(qs.begin(), qs.begin() + std::ptrdiff_t(r2), ks.begin()) ||
          !std::equal(qs.begin(), qs.begin() + std::ptrdiff_t(r2), vs.begin()))
        throw NoShader{"attention with broadcast batch dims or grouped KV heads"};
      const std::int64_t Sq = qs[r2], D = qs[r2 + 1], Sk = ks[r2], Dv = vs[r2 + 1];
      std::int64_t Bt = 1;
      for (std::size_t d = 0; d < r2; ++d) Bt *= qs[d];
      double scale = at.float_or("scale", 0.0);
      if (scale == 0) scale = 1 / std::sqrt(double(D));
      const bool causal = at.bool_or("causal", false);
      const std::uint32_t wg = 64, na = std::uint32_t((Dv + wg - 1) / wg);
      // Keys come in chunks of up to 64, one per thread, their rows staged in shared memory (padded by
      // one so the threads' rows fall in different banks) within 16 KiB.
      const std::int64_t elem = R.dbl ? 8 : 4;
      std::int64_t ch = 64;
      while (ch > 1 && ch * (D + 1) * elem > 16384) ch /= 2;
      if (ch * (D + 1) * elem > 16384 || D * elem > 8192)
        throw NoShader{"attention head dim too large for shared memory"};
      // The mask, broadcast over the scores [batch..., Sq, Sk] at (b..., qi, j).
      std::string mask;
      if (has(3)) {
        Ints ss(qs.begin(), qs.begin() + std::ptrdiff_t(r2));
        ss.push_back(Sq);
        ss.push_back(Sk);
        Space sp{ss, "((z * " + u(Sq) + " + qi) * " + u(Sk) + " + j)", {}};
        std::string cc;
        std::vector<std::string> names(ss.size());
        for (std::size_t d = 0; d < ss.size(); ++d) {
          names[d] = d == ss.size() - 1 ? "j" : d == ss.size() - 2 ? "qi" : "bz" + std::to_string(d);
          if (d + 2 < ss.size()) {
            std::int64_t bi = 1;
            for (std::size_t e = d + 1; e < r2; ++e) bi *= ss[e];
            cc += fmt::format("uint {} = (z / {}) % {};\n", names[d], u(bi), u(ss[d]));
          }
        }
        sp.coords = names;
        const auto mt = body.node(op->inputs[3]).dtype;
        std::string mv = sh.load(in(3), bcast_index(sp, body.node(op->inputs[3]).shape.extents()));
        mask = cc + (mt == DType::Bool ? "if (!" + mv + ") sc = " + R.k(-INFINITY) + ";\n"
                                       : "sc += " + T + "(" + mv + ");\n");
      }
      if (!R.dbl)
        if (auto tiled = attention_tiled(c, sh, {in(0), in(1), in(2), out}, {Bt, Sq, Sk, D, Dv}, scale, causal, mask))
          return std::move(*tiled);
      std::string main = fmt::format(
          "uint l = gl_LocalInvocationID.x;\n"
          "for (uint row = gl_WorkGroupID.x; row < {rows}; row += gl_NumWorkGroups.x) {{\n"
          "uint z = row / {Sq}, qi = row % {Sq};\n"
          "for (uint d = l; d < {D}; d += {wg}u) qv[d] = {qload};\n"
          "{T} m = {ninf}, lsum = {zero};\n{T} acc[{na}];\n"
          "for (uint a = 0u; a < {na}u; ++a) acc[a] = {zero};\n"
          "for (uint c0 = 0u; c0 < {Sk}; c0 += {CH}) {{\n"
          "  uint cn = min({CH}, {Sk} - c0);\n"
          "  for (uint e = l; e < cn * {D}; e += {wg}u) kt[e / {D}][e % {D}] = {kload};\n"
          "  barrier();\n"
          "  {T} sc = {ninf};\n"
          "  if (l < cn) {{\n"
          "    uint j = c0 + l;\n"
          "    sc = {zero};\n"
          "    for (uint d = 0u; d < {D}; ++d) sc += qv[d] * kt[l][d];\n"
          "    sc *= {scale};\n{causal}{mask}"
          "  }}\n"
          "{tmax}"
          "  {T} mn = max(m, red[0]);\n  barrier();\n"
          "  {T} p = (l < cn && mn != {ninf}) ? {pexp} : {zero};\n"
          "  if (l < {CH}) s[l] = p;\n"
          "{tsum}"
          "  {T} alpha = mn == {ninf} ? {one} : {aexp};\n"
          "  lsum = lsum * alpha + red[0];\n"
          "  for (uint a = 0u; a < {na}u; ++a) {{\n"
          "    uint d = l + a * {wg}u;\n"
          "    if (d >= {Dv}) break;\n"
          "    {T} t = {zero};\n"
          "    for (uint jj = 0u; jj < cn; ++jj) t += s[jj] * {vload};\n"
          "    acc[a] = acc[a] * alpha + t;\n"
          "  }}\n"
          "  m = mn;\n  barrier();\n"
          "}}\n"
          "for (uint a = 0u; a < {na}u; ++a) {{\n  uint d = l + a * {wg}u;\n  if (d < {Dv}) {store}}}\n"
          "}}\n",
          fmt::arg("rows", u(Bt * Sq)), fmt::arg("Sq", u(Sq)), fmt::arg("D", u(D)), fmt::arg("T", T),
          fmt::arg("ninf", R.k(-INFINITY)), fmt::arg("zero", R.k(0)), fmt::arg("one", R.k(1)), fmt::arg("na", na),
          fmt::arg("Sk", u(Sk)), fmt::arg("CH", u(ch)), fmt::arg("wg", wg),
          fmt::arg("qload", sh.load(in(0), "(z * " + u(Sq) + " + qi) * " + u(D) + " + d")),
          fmt::arg("kload", sh.load(in(1), "(z * " + u(Sk) + " + c0) * " + u(D) + " + e")),
          fmt::arg("scale", R.k(scale)),
          fmt::arg("causal", causal ? "    if (j > qi) sc = " + R.k(-INFINITY) + ";\n" : ""), fmt::arg("mask", mask),
          fmt::arg("tmax", tree(wg, "sc", "max(a, b)")), fmt::arg("tsum", tree(wg, "p", "a + b")),
          fmt::arg("pexp", R.exp("sc - mn")), fmt::arg("aexp", R.exp("m - mn")), fmt::arg("Dv", u(Dv)),
          fmt::arg("vload", sh.load(in(2), "(z * " + u(Sk) + " + c0 + jj) * " + u(Dv) + " + d")),
          fmt::arg("store", sh.store(out, "(z * " + u(Sq) + " + qi) * " + u(Dv) + " + d", "acc[a] / lsum")));
      std::string decls =
          fmt::format("shared {0} qv[{1}];\nshared {0} kt[{2}][{3}];\nshared {0} s[{2}];\nshared {0} red[{4}];\n", T, D,
                      ch, D + 1, wg);
      return {
          {{sh.source({wg, 1, 1}, decls, finish_tree(main, R)), groups_for(std::uint64_t(Bt * Sq) * wg, wg, c.caps)}},
          {}};
    }
    default: throw NoShader{"no shader for " + std::string(ir::op_name(op->op))};
  }
}

}  // namespace rlx::backends::vulkan
#endif
