#ifdef RLX_HAVE_VULKAN
// generate(): picks the generator for a kernel's kind; elementwise and leaf
// kernels, which are one grid-stride loop over the output, live here too.
#include "backends/vulkan/codegen.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

namespace rlx::backends::vulkan {

using ir::DType;
using ir::OpKind;

namespace {

constexpr std::uint32_t kLocal = 256;

// The grid-stride loop over `n` elements with index `i`, around `body`.
std::string loop(std::int64_t n, const std::string& body) {
  return fmt::format(
      "uint rlx_n = gl_NumWorkGroups.x * {}u;\nfor (uint i = gl_GlobalInvocationID.x; i < {}; i += rlx_n) {{\n{}}}\n",
      kLocal, u(n), body);
}

}  // namespace

std::array<std::uint32_t, 3> groups_for(std::uint64_t n, std::uint32_t local, const Caps& caps) {
  // Grid-stride loops over 32-bit indices: the last stride must not wrap around.
  const std::uint64_t cap = std::min<std::uint32_t>(caps.max_groups[0], 65535);
  if (n + cap * local >= (std::uint64_t(1) << 32)) throw NoShader{"more than 2^32 - 2^24 elements"};
  return {std::uint32_t(std::clamp<std::uint64_t>((n + local - 1) / local, 1, cap)), 1, 1};
}

// Elementwise kernels: each invocation takes kUnroll elements ("lanes") and
// issues every lane's loads before any arithmetic or store. One dependent load
// per invocation capped a 256M-element chain at 1.0 TB/s on an H200: a GPU
// keeps about 270K invocations resident, too few 4-byte loads in flight to
// cover HBM latency.
constexpr std::int64_t kUnroll = 4;

// kUnroll copies of a kernel body. Lane j's element index is the GLSL
// variable index(j), which the caller defines before coords().
class Lanes {
 public:
  Lanes(Shader& sh, const ir::Graph& body, const std::vector<std::int64_t>& iter) : body_(body) {
    spaces_.reserve(std::size_t(kUnroll));  // the emitters hold references into spaces_
    ems_.reserve(std::size_t(kUnroll));
    for (std::int64_t j = 0; j < kUnroll; ++j) {
      spaces_.push_back(Space{iter, index(j), {}});
      coords_ += coords_code(spaces_.back(), "c" + std::to_string(j) + "_");
      ems_.emplace_back(sh, body, spaces_.back(), "v" + std::to_string(j) + "_");
    }
  }
  static std::string index(std::int64_t j) { return "rlx_i" + std::to_string(j); }
  Emitter& operator[](std::int64_t j) { return ems_[std::size_t(j)]; }
  const std::string& coords() const { return coords_; }
  // Every lane's loads of every body input (inputs preset by the caller excepted).
  std::string loads() {
    std::string code;
    for (auto& em : ems_) {
      for (const auto& nd : body_.nodes())
        if (nd.op == OpKind::Input) em.value(nd.id);
      code += em.take_code();
    }
    return code;
  }
  // values[o][j]: body output o in lane j; `code` receives what computes them.
  std::vector<std::vector<std::string>> outputs(std::string& code) {
    std::vector<std::vector<std::string>> values(body_.outputs().size());
    for (auto& em : ems_) {
      for (std::size_t o = 0; o < values.size(); ++o) values[o].push_back(em.value(body_.outputs()[o].node));
      code += em.take_code();
    }
    return values;
  }

 private:
  const ir::Graph& body_;
  std::vector<Space> spaces_;
  std::vector<Emitter> ems_;
  std::string coords_;
};

// The common case of a large chain: f32 outputs at 16-byte offsets and n a
// multiple of 4. The lanes are 4 consecutive elements; every dense f32 operand
// at a 16-byte offset is read as one vec4 and each output written as one vec4
// (a warp moves 512 contiguous bytes per access); other operands (broadcast,
// other dtypes) load per lane.
std::optional<KernelCode> gen_elementwise_vec4(const GenCtx& c, std::int64_t n, const std::vector<std::int64_t>& iter) {
  static_assert(kUnroll == 4, "a vec4 holds one element per lane");
  const auto& k = c.kernel;
  Shader sh(c);
  auto vec4_ok = [&](compile::BufferId b) {
    const auto& buf = c.lir.buffer(b);
    return buf.dtype == DType::F32 && numel(buf.shape) == n && sh.byte_offset(b) % 16 == 0;
  };
  if (n % 4 != 0 || !std::all_of(k.outputs.begin(), k.outputs.end(), vec4_ok)) return std::nullopt;
  for (const auto& o : k.body.outputs())
    if (k.body.node(o.node).dtype != DType::F32) return std::nullopt;
  static constexpr const char* kXyzw[] = {"x", "y", "z", "w"};
  auto vec4_at = [&](compile::BufferId b) {
    return fmt::format("{}[{}u + q]", sh.vec4s(c.locs.at(std::size_t(b)).binding), sh.byte_offset(b) / 16);
  };
  Lanes lanes(sh, k.body, iter);
  std::string code;
  for (std::int64_t j = 0; j < kUnroll; ++j) code += fmt::format("uint {} = 4u * q + {}u;\n", Lanes::index(j), j);
  code += lanes.coords();
  for (const auto& nd : k.body.nodes()) {
    if (nd.op != OpKind::Input) continue;
    const auto b = k.input_buffer(nd);
    if (!vec4_ok(b)) continue;
    const std::string name = "rlx_l" + std::to_string(nd.id);
    code += fmt::format("vec4 {} = {};\n", name, vec4_at(b));
    for (std::int64_t j = 0; j < kUnroll; ++j) lanes[j].preset(nd.id, name + "." + kXyzw[j]);
  }
  code += lanes.loads();
  const auto values = lanes.outputs(code);
  for (std::size_t o = 0; o < k.outputs.size(); ++o)
    code += fmt::format("{} = vec4({});\n", vec4_at(k.outputs[o]), fmt::join(values[o], ", "));
  const std::string main =
      fmt::format("for (uint q = gl_GlobalInvocationID.x; q < {}; q += gl_NumWorkGroups.x * {}) {{\n{}}}\n", u(n / 4),
                  u(kLocal), code);
  return KernelCode{{{sh.source({kLocal, 1, 1}, "", main), groups_for(std::uint64_t(n / 4), kLocal, c.caps)}}, {}};
}

// Otherwise the lanes are a grid stride apart (each coalesced across a warp).
KernelCode gen_elementwise(const GenCtx& c) {
  const auto& k = c.kernel;
  auto iter = c.lir.buffer(k.outputs.at(0)).shape;
  std::int64_t n = numel(iter);
  if (n == 0) return {};
  if (auto code = gen_elementwise_vec4(c, n, iter)) return std::move(*code);
  Shader sh(c);
  const auto groups = groups_for(std::uint64_t((n + kUnroll - 1) / kUnroll), kLocal, c.caps);
  if (std::uint64_t(n) + std::uint64_t(kUnroll) * groups[0] * kLocal >= (std::uint64_t(1) << 32))
    throw NoShader{"more than 2^32 - 2^26 elements"};
  Lanes lanes(sh, k.body, iter);
  std::string code;
  // Loads past the end read the last element; only the stores are guarded.
  for (std::int64_t j = 0; j < kUnroll; ++j)
    code +=
        fmt::format("uint rlx_r{0} = rlx_b + {0}u * rlx_s, {1} = min(rlx_r{0}, {2});\n", j, Lanes::index(j), u(n - 1));
  code += lanes.coords() + lanes.loads();
  const auto values = lanes.outputs(code);
  for (std::int64_t j = 0; j < kUnroll; ++j) {
    code += fmt::format("if (rlx_r{} < {}) {{\n", j, u(n));
    for (std::size_t o = 0; o < k.outputs.size(); ++o)
      code += sh.store(k.outputs[o], Lanes::index(j), values[o][std::size_t(j)]);
    code += "}\n";
  }
  const std::string main = fmt::format(
      "uint rlx_s = gl_NumWorkGroups.x * {};\n"
      "for (uint rlx_b = gl_GlobalInvocationID.x; rlx_b < {}; rlx_b += {}u * rlx_s) {{\n{}}}\n",
      u(kLocal), u(n), kUnroll, code);
  return {{{sh.source({kLocal, 1, 1}, "", main), groups}}, {}};
}

KernelCode gen_leaf(const GenCtx& c) {
  const auto& k = c.kernel;
  const ir::Node* leaf = nullptr;
  for (const auto& nd : k.body.nodes())
    if (nd.op == OpKind::Iota || nd.op == OpKind::RandomUniform || nd.op == OpKind::RandomNormal) leaf = &nd;
  if (!leaf || k.outputs.size() != 1) throw NoShader{"not a leaf kernel"};
  auto shape = c.lir.buffer(k.outputs[0]).shape;
  std::int64_t n = numel(shape);
  if (n == 0) return {};
  Shader sh(c);
  Space sp{shape, "i", {}};
  std::string body, decls, value;
  const auto& at = leaf->attrs;
  if (leaf->op == OpKind::Iota) {
    body = coords_code(sp, "c");
    auto axis = at.get_int("axis");
    if (axis < 0) axis += std::int64_t(shape.size());
    value = sh.convert("int64_t(" + sp.coords.at(std::size_t(axis)) + ")", DType::I64, leaf->dtype);
  } else {
    decls = R"(uint64_t rlx_mix(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ul + index * 0xD1B54A32D192ED03ul + 0x632BE59BD9B4E019ul;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ul;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBul;
  return z ^ (z >> 31);
}
)";
    std::string seed = fmt::format("0x{:016x}ul", std::uint64_t(at.get_int("seed")));
    // f64 outputs follow the reference's double formula; the rest compute in f32.
    const bool dbl = leaf->dtype == DType::F64;
    const DType rt = dbl ? DType::F64 : DType::F32;
    const std::string real = dbl ? "double" : "float", one = dbl ? "1.0lf" : "1.0";
    std::string r;
    if (leaf->op == OpKind::RandomUniform) {
      double lo = at.float_or("low", 0.0), hi = at.float_or("high", 1.0);
      r = fmt::format("{} u = {}(float(rlx_mix({}, uint64_t(i)) >> 40) * (1.0 / 16777216.0));\n", real, real, seed);
      value = fmt::format("({} + {} * u)", literal(lo, rt), literal(hi - lo, rt));
    } else {
      double mean = at.float_or("mean", 0.0), sd = at.float_or("std", 1.0);
      r = fmt::format(
          "{0} u1 = ({0}(rlx_mix({1}, 2ul * uint64_t(i)) >> 40) + {2}) * ({2} / 16777216.0);\n"
          "{0} u2 = {0}(rlx_mix({1}, 2ul * uint64_t(i) + 1ul) >> 40) * ({2} / 16777216.0);\n",
          real, seed, one);
      if (dbl) {
        sh.use("d_log");
        sh.use("d_sincos");
      }
      value = fmt::format("({} + {} * (sqrt({} * {}(u1)) * {}({} * u2)))", literal(mean, rt), literal(sd, rt),
                          literal(-2.0, rt), dbl ? "rlx_log" : "log", dbl ? "rlx_cos" : "cos",
                          literal(6.283185307179586, rt));
    }
    body = r;
    value = sh.convert(value, rt, leaf->dtype);
  }
  body += sh.store(k.outputs[0], "i", value);
  return {{{sh.source({kLocal, 1, 1}, decls, loop(n, body)), groups_for(std::uint64_t(n), kLocal, c.caps)}}, {}};
}

std::optional<KernelCode> generate(const GenCtx& c, std::string* why) {
  try {
    for (const auto& nd : c.kernel.body.nodes()) {
      if (nd.dtype == DType::F64 && !c.caps.fp64) throw NoShader{"f64 needs shaderFloat64"};
      if (std::find(vulkan_dtypes().begin(), vulkan_dtypes().end(), nd.dtype) == vulkan_dtypes().end())
        throw NoShader{std::string(ir::dtype_name(nd.dtype)) + " is not a dtype the shaders compute"};
    }
    switch (c.kernel.kind) {
      case compile::KernelKind::Elementwise: return gen_elementwise(c);
      case compile::KernelKind::Reduce: return gen_reduce(c);
      case compile::KernelKind::MatMul: return gen_matmul(c);
      case compile::KernelKind::Movement: return gen_movement(c);
      case compile::KernelKind::Native: return gen_native(c);
      case compile::KernelKind::Leaf: return gen_leaf(c);
      default: throw NoShader{"no shader for this kernel kind"};
    }
  } catch (const NoShader& e) {
    if (why) *why = e.why;
    return std::nullopt;
  }
}

}  // namespace rlx::backends::vulkan
#endif
