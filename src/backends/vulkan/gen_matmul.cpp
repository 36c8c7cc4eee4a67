#ifdef RLX_HAVE_VULKAN
// MatMul kernels. f32 products use tiled GEMMs: a workgroup computes a tile
// of C through shared-memory tiles of A (stored k-major) and B, each thread a
// block of registers, with the next K tile prefetched into registers while the
// current one is used. Large products take 128 x 128 tiles; products too small
// to fill the GPU take 32 x 32 tiles with K split within (and, if needed,
// across) workgroups (tile32_main, which conv shares); the rest 64 x 64.
// Other dtypes (f64, integers with wrapping int64 sums) and products under 32
// rows or columns take one thread per output element. The epilogue runs per
// element before its store.
#include <fmt/format.h>

#include <algorithm>

#include "backends/vulkan/codegen.hpp"

namespace rlx::backends::vulkan {

using ir::DType;
using ir::OpKind;

namespace {

struct Tile {
  std::uint32_t bm, bn, bk, tm, tn;
  std::uint32_t threads() const { return (bm / tm) * (bn / tn); }
};

}  // namespace

TileLoads scalar_tile_loads(const std::string& a_code, const std::string& b_code) {
  TileLoads t;
  for (int q = 0; q < 4; ++q) {
    t.load += fmt::format(
        "  {{ uint e = tid + {0}u, gm = m0 + (e & 31u), gk = k0 + (e >> 5); float v; {1} ra{2} = v; }}\n"
        "  {{ uint e = tid + {0}u, gk = k0 + (e >> 5), gn = n0 + (e & 31u); float v; {3} rb{2} = v; }}\n",
        q * 256, a_code, q, b_code);
    // A's element e is (row e & 31, k e >> 5), B's (k e >> 5, column e & 31): both land at [e >> 5][e & 31].
    t.stash += fmt::format(
        "  {{ uint e = tid + {0}u; As[e >> 5][(e & 31u) >> 2][e & 3u] = ra{1}; Bs[e >> 5][(e & 31u) >> 2][e & 3u] = "
        "rb{1}; }}\n",
        q * 256, q);
  }
  return t;
}

std::string tile32_main(std::int64_t M, std::int64_t N, std::int64_t kchunk, const TileLoads& loads,
                        const std::string& result) {
  static constexpr const char* kXyzw[] = {"x", "y", "z", "w"};
  std::string compute, partial;
  for (int kk = 0; kk < 8; ++kk) {
    compute += fmt::format("    {{ vec4 a = As[g * 8u + {0}u][ty], b = Bs[g * 8u + {0}u][tx];\n", kk);
    for (int i = 0; i < 4; ++i) compute += fmt::format("      c{0} = fma(vec4(a.{1}), b, c{0});\n", i, kXyzw[i]);
    compute += "    }\n";
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j)
      partial += fmt::format("Cs[g][ty * 4u + {0}u][tx * 4u + {1}u] = c{0}.{2};\n", i, j, kXyzw[j]);
  return fmt::format(
      "uint tid = gl_LocalInvocationID.x, g = tid >> 6, t = tid & 63u, ty = t >> 3, tx = t & 7u;\n"
      "uint n0 = gl_WorkGroupID.x * 32u, m0 = gl_WorkGroupID.y * 32u;\n"
      "vec4 c0 = vec4(0.0), c1 = vec4(0.0), c2 = vec4(0.0), c3 = vec4(0.0);\n"
      "float ra0, ra1, ra2, ra3, rb0, rb1, rb2, rb3;\nvec4 va, vb;\n"
      "{load}"
      "for (uint kt = 0u; kt < {KT}; ++kt) {{\n"
      "{stash}"
      "  barrier();\n"
      "  k0 += 32u;\n"
      "  if (kt + 1u < {KT}) {{\n{load}  }}\n"
      "{compute}"
      "  barrier();\n"
      "}}\n"
      "{partial}"
      "barrier();\n"
      "for (uint e = tid; e < 1024u; e += 256u) {{\n"
      "  uint row = e >> 5, col = e & 31u, m = m0 + row, n = n0 + col;\n"
      "  float acc = Cs[0][row][col] + Cs[1][row][col] + Cs[2][row][col] + Cs[3][row][col];\n"
      "  if (m < {M} && n < {N}) {{ {result} }}\n"
      "}}\n",
      fmt::arg("KT", u((kchunk + 31) / 32)), fmt::arg("M", u(M)), fmt::arg("N", u(N)), fmt::arg("load", loads.load),
      fmt::arg("stash", loads.stash), fmt::arg("compute", compute), fmt::arg("partial", partial),
      fmt::arg("result", result));
}

KernelCode gen_matmul(const GenCtx& c) {
  const auto& k = c.kernel;
  const ir::Graph& body = k.body;
  const ir::Node* mm = nullptr;
  for (const auto& n : body.nodes())
    if (n.op == OpKind::MatMul) mm = &n;
  if (!mm || k.outputs.size() != 1) throw NoShader{"not a matmul kernel"};
  const ir::Node& an = body.node(mm->inputs[0]);
  const ir::Node& bn = body.node(mm->inputs[1]);
  if (an.op != OpKind::Input || bn.op != OpKind::Input) throw NoShader{"matmul operands are not buffers"};
  const auto as = an.shape.extents(), bs = bn.shape.extents(), os = mm->shape.extents();
  const std::size_t r = os.size();
  const std::int64_t M = os[r - 2], N = os[r - 1], K = as[as.size() - 1];
  std::int64_t B = 1;
  for (std::size_t d = 0; d + 2 < r; ++d) B *= os[d];
  if (as.size() != r || (bs.size() != r && bs.size() != 2)) throw NoShader{"matmul operands of unexpected rank"};
  if (B * M * N == 0) return {};
  const bool b_batched = bs.size() == r && B > 1;
  const auto abuf = k.input_buffer(an), bbuf = k.input_buffer(bn);

  Shader sh(c);
  const CT ct = compute_type(an.dtype);
  const bool fl = ct == CT::F32 || ct == CT::F64;
  const std::string acc_t = fl ? std::string(ct_name(ct)) : "int64_t";

  // rlx_store(o, acc): the epilogue at output element o, then the store.
  Space out_sp{os, "o", {}};
  std::string fn = coords_code(out_sp, "y");
  Emitter em(sh, body, out_sp, "e");
  em.preset(mm->id, "mmv");
  std::string ov = em.value(body.outputs()[0].node);
  std::string result = fl ? sh.narrow("acc", mm->dtype) : sh.convert("acc", DType::I64, mm->dtype);
  fn = fmt::format("void rlx_store(uint o, {} acc) {{\n{} mmv = {};\n{}{}{}}}\n", acc_t,
                   ct_name(compute_type(mm->dtype)), result, fn, em.take_code(), sh.store(k.outputs[0], "o", ov));
  const std::string a_at = u(M * K), b_at = b_batched ? u(K * N) : "0u";

  // Tiles whenever both sides reach 32 (measured on an H200: a 128-row product on four 128x128 tiles ran 5x
  // faster than one thread per output element).
  const bool grid_ok = std::uint64_t((N + 31) / 32) <= c.caps.max_groups[0] &&
                       std::uint64_t((M + 31) / 32) <= c.caps.max_groups[1] && std::uint64_t(B) <= c.caps.max_groups[2];

  // The fast path: 16-byte loads, a 128x128 tile, each thread 8x8 outputs as 2x2 blocks of 4x4 (vec4
  // reads from shared memory), all in named registers: the code below is unrolled here, so no array is
  // indexed at run time (a driver that cannot unroll one would move it to slow local memory).
  const bool aligned = K % 4 == 0 && N % 4 == 0 && sh.byte_offset(abuf) % 16 == 0 && sh.byte_offset(bbuf) % 16 == 0;
  // 128 x 128 tiles only when there are enough of them to fill a large GPU
  // (an H200 has 132 SMs; a 128 x 512 product made 4 workgroups and took 400 us):
  // smaller products take 64 x 64 tiles, 4x as many workgroups.
  const bool many_tiles = B * ((M + 127) / 128) * ((N + 127) / 128) >= 64;
  if (ct == CT::F32 && aligned && grid_ok && M >= 128 && N >= 128 && many_tiles) {
    const std::int64_t KT = (K + 7) / 8;
    const std::string A4 = sh.vec4s(c.locs.at(std::size_t(abuf)).binding),
                      B4 = sh.vec4s(c.locs.at(std::size_t(bbuf)).binding);
    std::string decls = "shared vec4 As[8][32];\nshared vec4 Bs[8][32];\n" + fn;
    static constexpr const char* kXyzw[] = {"x", "y", "z", "w"};
    std::string init, compute, store;
    for (int i = 0; i < 8; ++i)
      for (int h = 0; h < 2; ++h) init += fmt::format("vec4 acc{}_{} = vec4(0.0);\n", i, h);
    for (int kk = 0; kk < 8; ++kk) {
      compute += fmt::format(
          "  {{ vec4 a0 = As[{0}][ty], a1 = As[{0}][ty + 16u], b0 = Bs[{0}][tx], b1 = Bs[{0}][tx + 16u];\n", kk);
      for (int i = 0; i < 8; ++i)
        for (int h = 0; h < 2; ++h)
          compute +=
              fmt::format("    acc{0}_{1} = fma(vec4(a{2}.{3}), b{1}, acc{0}_{1});\n", i, h, i / 4, kXyzw[i % 4]);
      compute += "  }\n";
    }
    for (int i = 0; i < 8; ++i) {
      store += fmt::format("{{ uint m = m0 + ty * 4u + {}u;\nif (m < {}) {{\n", i < 4 ? i : 60 + i, u(M));
      for (int h = 0; h < 2; ++h)
        for (int j = 0; j < 4; ++j)
          store += fmt::format(
              "  {{ uint n = n0 + tx * 4u + {}u; if (n < {}) rlx_store((z * {} + m) * {} + n, acc{}_{}.{}); }}\n",
              h * 64 + j, u(N), u(M), u(N), i, h, kXyzw[j]);
      store += "} }\n";
    }
    std::string main = fmt::format(
        "uint tid = gl_LocalInvocationID.x, tx = tid & 15u, ty = tid >> 4;\n"
        "uint n0 = gl_WorkGroupID.x * 128u, m0 = gl_WorkGroupID.y * 128u, z = gl_WorkGroupID.z;\n"
        "uint am = tid >> 1, ak = (tid & 1u) * 4u, bk = tid >> 5, bn = (tid & 31u) * 4u;\n"
        "uint arow = {aoff}u + z * {a_at} + (m0 + am) * {K}, bcol = {boff}u + z * {b_at} + n0 + bn;\n"
        "bool ain = m0 + am < {M}, bin = n0 + bn < {N};\n{init}"
        "vec4 ra = (ain && ak < {K}) ? {A4}[(arow + ak) >> 2] : vec4(0.0);\n"
        "vec4 rb = (bin && bk < {K}) ? {B4}[(bcol + bk * {N}) >> 2] : vec4(0.0);\n"
        "for (uint kt = 1u; kt <= {KT}; ++kt) {{\n"
        "  As[ak][am >> 2][am & 3u] = ra.x; As[ak + 1u][am >> 2][am & 3u] = ra.y;\n"
        "  As[ak + 2u][am >> 2][am & 3u] = ra.z; As[ak + 3u][am >> 2][am & 3u] = ra.w;\n"
        "  Bs[bk][bn >> 2] = rb;\n"
        "  barrier();\n"
        "  if (kt < {KT}) {{\n"
        "    uint k0 = kt * 8u;\n"
        "    ra = (ain && k0 + ak < {K}) ? {A4}[(arow + k0 + ak) >> 2] : vec4(0.0);\n"
        "    rb = (bin && k0 + bk < {K}) ? {B4}[(bcol + (k0 + bk) * {N}) >> 2] : vec4(0.0);\n"
        "  }}\n{compute}"
        "  barrier();\n"
        "}}\n{store}",
        fmt::arg("aoff", sh.byte_offset(abuf) / 4), fmt::arg("boff", sh.byte_offset(bbuf) / 4), fmt::arg("a_at", a_at),
        fmt::arg("b_at", b_at), fmt::arg("K", u(K)), fmt::arg("M", u(M)), fmt::arg("N", u(N)), fmt::arg("KT", u(KT)),
        fmt::arg("A4", A4), fmt::arg("B4", B4), fmt::arg("init", init), fmt::arg("compute", compute),
        fmt::arg("store", store));
    return {{{sh.source({256, 1, 1}, decls, main),
              {std::uint32_t((N + 127) / 128), std::uint32_t((M + 127) / 128), std::uint32_t(B)}}},
            {}};
  }

  // Products too small to fill the GPU with 64 x 64 tiles (an encoder's 128-row projections): 32 x 32 tiles,
  // 4x as many workgroups, and within each the K range split over four groups of 64 threads whose partial
  // tiles are summed in shared memory, so each thread's loop is a quarter as long. When even that leaves
  // fewer than 256 workgroups, K is also split across workgroups (at least 256 of K each): their partial
  // tiles go to scratch and a second dispatch sums them and runs the epilogue. Loads are unconditional
  // (an index past the edge is clamped and the value replaced by zero: a load inside a branch is not issued
  // ahead with the others, which on an H200 cost the attention kernel 3x); 16 bytes wide for aligned f32
  // rows, else scalar (any alignment or dtype), with A read row-fastest so that its transposed stores to
  // shared memory do not conflict.
  const bool few_tiles = B * ((M + 63) / 64) * ((N + 63) / 64) < 128;
  if (ct == CT::F32 && grid_ok && few_tiles && K >= 64) {
    const std::int64_t tiles = B * ((M + 31) / 32) * ((N + 31) / 32);
    std::int64_t splits = std::clamp<std::int64_t>((256 + tiles - 1) / tiles, 1, std::max<std::int64_t>(K / 256, 1));
    while (splits > 1 &&
           (std::uint64_t(splits * B * M * N * 4) > kMaxScratch || std::uint64_t(splits * B) > c.caps.max_groups[2]))
      --splits;
    const std::int64_t kchunk = ((K + splits - 1) / splits + 31) / 32 * 32;
    splits = (K + kchunk - 1) / kchunk;
    TileLoads loads;
    if (aligned && c.lir.buffer(abuf).dtype == DType::F32 && c.lir.buffer(bbuf).dtype == DType::F32) {
      // Rows of whole vec4s at 16-byte offsets: one 16-byte load of A and one of B per thread.
      loads.load = fmt::format(
          "  {{ uint row = tid >> 3, gm = m0 + row, gk = k0 + (tid & 7u) * 4u;\n"
          "    vec4 v = {A4}[({aoff}u + abase + min(gm, {M1}) * {K} + min(gk, {K4})) >> 2]; va = (gm < {M} && gk < "
          "kend) ? v : vec4(0.0); }}\n"
          "  {{ uint gk = k0 + (tid >> 3), gn = n0 + (tid & 7u) * 4u;\n"
          "    vec4 v = {B4}[({boff}u + bbase + min(gk, {K1}) * {N} + min(gn, {N4})) >> 2]; vb = (gk < kend && gn < "
          "{N}) ? v : vec4(0.0); }}\n",
          fmt::arg("A4", sh.vec4s(c.locs.at(std::size_t(abuf)).binding)),
          fmt::arg("B4", sh.vec4s(c.locs.at(std::size_t(bbuf)).binding)), fmt::arg("aoff", sh.byte_offset(abuf) / 4),
          fmt::arg("boff", sh.byte_offset(bbuf) / 4), fmt::arg("M", u(M)), fmt::arg("N", u(N)), fmt::arg("K", u(K)),
          fmt::arg("M1", u(M - 1)), fmt::arg("K1", u(K - 1)), fmt::arg("K4", u(K - 4)), fmt::arg("N4", u(N - 4)));
      loads.stash =
          "  { uint row = tid >> 3, kq = (tid & 7u) * 4u;\n"
          "    As[kq][row >> 2][row & 3u] = va.x; As[kq + 1u][row >> 2][row & 3u] = va.y;\n"
          "    As[kq + 2u][row >> 2][row & 3u] = va.z; As[kq + 3u][row >> 2][row & 3u] = va.w;\n"
          "    Bs[tid >> 3][tid & 7u] = vb; }\n";
    } else {
      loads = scalar_tile_loads(
          fmt::format("v = {}; v = (gm < {} && gk < kend) ? v : 0.0;",
                      sh.load(abuf, "abase + min(gm, " + u(M - 1) + ") * " + u(K) + " + min(gk, " + u(K - 1) + ")"),
                      u(M)),
          fmt::format("v = {}; v = (gk < kend && gn < {}) ? v : 0.0;",
                      sh.load(bbuf, "bbase + min(gk, " + u(K - 1) + ") * " + u(N) + " + min(gn, " + u(N - 1) + ")"),
                      u(N)));
    }
    const std::string o = "(z * " + u(M) + " + m) * " + u(N) + " + n";
    const std::string result =
        splits == 1 ? "rlx_store(" + o + ", acc);" : sh.scratch("sp * " + u(B * M * N) + " + " + o) + " = acc;";
    std::string decls = std::string(kTile32Shared) + fn;
    std::string main = fmt::format(
                           "uint sp = gl_WorkGroupID.z / {0}, z = gl_WorkGroupID.z % {0};\n"
                           "uint abase = z * {1}, bbase = z * {2}, k0 = sp * {3}, kend = min({4}, k0 + {3});\n",
                           u(B), a_at, b_at, u(kchunk), u(K)) +
                       tile32_main(M, N, kchunk, loads, result);
    const std::array<std::uint32_t, 3> grid{std::uint32_t((N + 31) / 32), std::uint32_t((M + 31) / 32),
                                            std::uint32_t(B * splits)};
    if (splits == 1) return {{{sh.source({256, 1, 1}, decls, main), grid}}, {}};
    // The second dispatch: each output element sums its partials, then the epilogue.
    std::string parts;
    for (std::int64_t p = 0; p < splits; ++p) parts += (p ? " + " : "") + sh.scratch(u(p * B * M * N) + " + o");
    std::string reduce = fmt::format(
        "uint rlx_n = gl_NumWorkGroups.x * 256u;\n"
        "for (uint o = gl_GlobalInvocationID.x; o < {}; o += rlx_n) rlx_store(o, {});\n",
        u(B * M * N), parts);
    KernelCode code{{{sh.source({256, 1, 1}, decls, main), grid},
                     {sh.source({256, 1, 1}, fn, reduce), groups_for(std::uint64_t(B * M * N), 256, c.caps)}},
                    {}};
    code.scratch_bytes = std::uint64_t(splits * B * M * N * 4);
    return code;
  }

  if (ct == CT::F32 && grid_ok && M >= 32 && N >= 32) {
    const Tile t = M >= 128 && N >= 128 && many_tiles ? Tile{128, 128, 8, 8, 8} : Tile{64, 64, 16, 4, 4};
    const std::uint32_t nt = t.threads(), la = t.bm * t.bk / nt, lb = t.bk * t.bn / nt;
    std::uint64_t gx = std::uint64_t((N + t.bn - 1) / t.bn), gy = std::uint64_t((M + t.bm - 1) / t.bm);
    {
      const std::int64_t KT = (K + t.bk - 1) / t.bk;
      std::string decls =
          fmt::format("shared float As[{}][{}];\nshared float Bs[{}][{}];\n", t.bk, t.bm, t.bk, t.bn) + fn;
      // Global loads of tile kt into registers (zero outside the matrices), and their stores into shared memory.
      std::string load = fmt::format(
          "[[unroll]] for (uint q = 0u; q < {la}u; ++q) {{\n"
          "  uint e = tid + q * {nt}u, mr = e / {bk}u, kc = e % {bk}u, gm = m0 + mr, gk = kt * {bk}u + kc;\n"
          "  float v = {aload}; ra[q] = (gm < {M} && gk < {K}) ? v : 0.0;\n}}\n"
          "[[unroll]] for (uint q = 0u; q < {lb}u; ++q) {{\n"
          "  uint e = tid + q * {nt}u, kr = e / {bn}u, nc = e % {bn}u, gk = kt * {bk}u + kr, gn = n0 + nc;\n"
          "  float v = {bload}; rb[q] = (gk < {K} && gn < {N}) ? v : 0.0;\n}}\n",
          fmt::arg("la", la), fmt::arg("lb", lb), fmt::arg("nt", nt), fmt::arg("bk", t.bk), fmt::arg("bn", t.bn),
          fmt::arg("M", u(M)), fmt::arg("N", u(N)), fmt::arg("K", u(K)),
          fmt::arg("aload",
                   sh.load(abuf, "abase + min(gm, " + u(M - 1) + ") * " + u(K) + " + min(gk, " + u(K - 1) + ")")),
          fmt::arg("bload",
                   sh.load(bbuf, "bbase + min(gk, " + u(K - 1) + ") * " + u(N) + " + min(gn, " + u(N - 1) + ")")));
      std::string stash = fmt::format(
          "[[unroll]] for (uint q = 0u; q < {la}u; ++q) {{ uint e = tid + q * {nt}u; As[e % {bk}u][e / {bk}u] = ra[q]; "
          "}}\n"
          "[[unroll]] for (uint q = 0u; q < {lb}u; ++q) {{ uint e = tid + q * {nt}u; Bs[e / {bn}u][e % {bn}u] = rb[q]; "
          "}}\n",
          fmt::arg("la", la), fmt::arg("lb", lb), fmt::arg("nt", nt), fmt::arg("bk", t.bk), fmt::arg("bn", t.bn));
      // The stores with constant indices into acc (see the fast path).
      std::string store;
      for (std::uint32_t i = 0; i < t.tm; ++i)
        for (std::uint32_t j = 0; j < t.tn; ++j)
          store += fmt::format(
              "{{ uint m = m0 + ty + {}u, n = n0 + tx + {}u; if (m < {} && n < {}) rlx_store((z * {} + m) * {} + n, "
              "acc[{}][{}]); }}\n",
              i * (t.bm / t.tm), j * (t.bn / t.tn), u(M), u(N), u(M), u(N), i, j);
      std::string main = fmt::format(
          "uint tid = gl_LocalInvocationID.x, tx = tid % {cx}u, ty = tid / {cx}u;\n"
          "uint n0 = gl_WorkGroupID.x * {bn}u, m0 = gl_WorkGroupID.y * {bm}u, z = gl_WorkGroupID.z;\n"
          "uint abase = z * {a_at}, bbase = z * {b_at};\n"
          "float acc[{tm}][{tn}];\n"
          "for (uint i = 0u; i < {tm}u; ++i) for (uint j = 0u; j < {tn}u; ++j) acc[i][j] = 0.0;\n"
          "float ra[{la}], rb[{lb}];\n"
          "uint kt = 0u;\n{load}{stash}barrier();\n"
          "for (kt = 1u; kt <= {KT}; ++kt) {{\n"
          "  if (kt < {KT}) {{\n{load}  }}\n"
          "  [[unroll]] for (uint kk = 0u; kk < {bk}u; ++kk) {{\n"
          "    float av[{tm}], bv[{tn}];\n"
          "    [[unroll]] for (uint i = 0u; i < {tm}u; ++i) av[i] = As[kk][ty + i * {cy}u];\n"
          "    [[unroll]] for (uint j = 0u; j < {tn}u; ++j) bv[j] = Bs[kk][tx + j * {cx}u];\n"
          "    [[unroll]] for (uint i = 0u; i < {tm}u; ++i) [[unroll]] for (uint j = 0u; j < {tn}u; ++j) acc[i][j] = "
          "fma(av[i], bv[j], acc[i][j]);\n"
          "  }}\n"
          "  barrier();\n"
          "  if (kt < {KT}) {{\n{stash}  barrier();\n  }}\n"
          "}}\n"
          "{store}",
          fmt::arg("cx", t.bn / t.tn), fmt::arg("cy", t.bm / t.tm), fmt::arg("bn", t.bn), fmt::arg("bm", t.bm),
          fmt::arg("bk", t.bk), fmt::arg("tm", t.tm), fmt::arg("tn", t.tn), fmt::arg("la", la), fmt::arg("lb", lb),
          fmt::arg("a_at", a_at), fmt::arg("b_at", b_at), fmt::arg("KT", u(KT)), fmt::arg("M", u(M)),
          fmt::arg("N", u(N)), fmt::arg("load", load), fmt::arg("stash", stash), fmt::arg("store", store));
      return {{{sh.source({nt, 1, 1}, decls, main), {std::uint32_t(gx), std::uint32_t(gy), std::uint32_t(B)}}}, {}};
    }
  }

  // One thread per output element.
  const std::int64_t total = B * M * N;
  std::string main = fmt::format(
      "uint rlx_n = gl_NumWorkGroups.x * 256u;\n"
      "for (uint o = gl_GlobalInvocationID.x; o < {total}; o += rlx_n) {{\n"
      "  uint n = o % {N}, m = (o / {N}) % {M}, z = o / {MN};\n"
      "  uint abase = z * {a_at} + m * {K}, bbase = z * {b_at} + n;\n"
      "  {acc_t} acc = {acc_t}(0);\n"
      "  for (uint kk = 0u; kk < {K}; ++kk) acc += {acc_t}({aload}) * {acc_t}({bload});\n"
      "  rlx_store(o, acc);\n}}\n",
      fmt::arg("total", u(total)), fmt::arg("N", u(N)), fmt::arg("M", u(M)), fmt::arg("MN", u(M * N)),
      fmt::arg("a_at", a_at), fmt::arg("b_at", b_at), fmt::arg("K", u(K)), fmt::arg("acc_t", acc_t),
      fmt::arg("aload", sh.load(abuf, "abase + kk")), fmt::arg("bload", sh.load(bbuf, "bbase + kk * " + u(N))));
  return {{{sh.source({256, 1, 1}, fn, main), groups_for(std::uint64_t(total), 256, c.caps)}}, {}};
}

}  // namespace rlx::backends::vulkan
#endif
