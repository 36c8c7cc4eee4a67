#include "scaffold.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <fstream>
#include <iterator>

#include "rlx/error.hpp"

namespace rlx::tools {
namespace {

// Type names the templates use unqualified after `using namespace rlx::extend`:
// a class of the same name would make them ambiguous.
constexpr std::array<std::string_view, 20> kTemplateTypes = {
    "Attrs",  "AttrSpec",    "AttrType",  "BuiltModel", "CompiledGraph",  "Device",    "DType",
    "Error",  "FlowCtx",     "FlowValue", "Graph",      "LayerStage",     "ModelFlow", "Node",
    "NodeId", "OpExtension", "OpKind",    "Session",    "StageArtifacts", "Tensor"};

struct Names {
  std::string cls;    // GatedGate
  std::string snake;  // gated_gate
};

Names names_for(std::string_view name, std::string_view command) {
  bool ident = !name.empty() && std::isalpha(static_cast<unsigned char>(name[0])) &&
               std::all_of(name.begin(), name.end(),
                           [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
  if (!ident)
    throw Error(std::string(command) + ": '" + std::string(name) +
                "' is not a usable name: use letters, digits and '_', starting with a letter (e.g. GatedMlp)");
  Names n;
  bool up = true;
  for (char c : name) {
    if (c == '_') {
      up = true;
    } else {
      n.cls += up ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
      up = false;
    }
  }
  for (std::size_t i = 0; i < n.cls.size(); ++i) {
    auto at = [&](std::size_t j) { return static_cast<unsigned char>(n.cls[j]); };
    bool boundary =
        i > 0 && std::isupper(at(i)) &&
        (std::islower(at(i - 1)) || (std::isupper(at(i - 1)) && i + 1 < n.cls.size() && std::islower(at(i + 1))));
    if (boundary) n.snake += '_';
    n.snake += static_cast<char>(std::tolower(at(i)));
  }
  if (std::find(kTemplateTypes.begin(), kTemplateTypes.end(), n.cls) != kTemplateTypes.end())
    throw Error(std::string(command) + ": '" + n.cls + "' would clash with rlx::extend::" + n.cls +
                ", which the template uses; pick another name");
  return n;
}

std::string fill(std::string text, const Names& n, std::string_view command) {
  auto replace_all = [&text](std::string_view key, const std::string& value) {
    for (auto at = text.find(key); at != std::string::npos; at = text.find(key, at + value.size()))
      text.replace(at, key.size(), value);
  };
  replace_all("@Class@", n.cls);
  replace_all("@snake@", n.snake);
  replace_all("@command@", std::string(command));
  return text;
}

constexpr std::string_view kBuild = R"(//
// Build it against an RLX build tree (or an install: <prefix>/include, <prefix>/lib):
//   c++ -std=c++20 -O2 @snake@.cpp -I<rlx>/include -L<rlx-build> -lrlx -Wl,-rpath,<rlx-build> -o @snake@
// or from CMake: find_package(rlx REQUIRED), then target_link_libraries(<target> PRIVATE rlx::rlx).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include <rlx/extend.hpp>

using namespace rlx::extend;

namespace {

Tensor random_tensor(DType dtype, const std::vector<std::int64_t>& shape, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  Tensor t(dtype, shape);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
  return t;
}

// The largest |got - want| / max(1, |want|) over all outputs; NaN stays NaN.
double max_error(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  double err = got.size() == want.size() ? 0 : INFINITY;
  for (std::size_t o = 0; o < std::min(got.size(), want.size()); ++o)
    for (std::int64_t i = 0; i < want[o].numel(); ++i) {
      double e = std::fabs(got[o].get(i) - want[o].get(i)) / std::max(1.0, std::fabs(want[o].get(i)));
      if (!(e <= err)) err = e;
    }
  return err;
}

}  // namespace
)";

constexpr std::string_view kOpHead = R"(// @Class@: a custom op for RLX, scaffolded by `rlx @command@ @Class@`.
//
// Fill in, in this order:
//   1. num_inputs, attr_schema and infer: the op's signature and its output
//      dtype and shape (throw rlx::Error for inputs that do not fit);
//   2. lower: the op as primitives, so that it fuses and runs on every backend.
//      An op that primitives cannot express drops `lower`, overrides
//      `reference` and registers a host kernel in register_@snake@() instead;
//   3. main: a graph using the op, checked against the float64 reference.
)";

constexpr std::string_view kOpBody = R"(
class @Class@ final : public OpExtension {
 public:
  std::string_view name() const override { return "@snake@"; }
  int num_inputs() const override { return 1; }
  std::vector<AttrSpec> attr_schema() const override { return {{"alpha", AttrType::Float, /*required=*/true}}; }
  TypeInfo infer(std::span<const TypeInfo> inputs, const Attrs&) const override {
    if (!rlx::ir::is_float(inputs[0].dtype)) throw Error("@snake@ needs a float input");
    return inputs[0];
  }
  // Placeholder math: x * sigmoid(alpha * x). Inputs are ids in `g`.
  std::optional<NodeId> lower(Graph& g, std::span<const NodeId> inputs, const Attrs& attrs) const override {
    NodeId x = inputs[0];
    NodeId alpha = g.scalar(attrs.get_float("alpha"), g.node(x).dtype);
    return g.mul(x, g.unary(OpKind::Sigmoid, g.mul(x, alpha)));
  }
};

void register_@snake@() {
  register_op(std::make_shared<@Class@>());
  // Kernels, by op name, take precedence over the lowering where they exist:
  // register_host_kernel("@snake@", ...) for the CPU, register_vulkan_kernel /
  // register_cuda_kernel for raw GPU kernels (rlx/runtime/custom_kernels.hpp).
}

int main() try {
  register_@snake@();

  Graph g("@snake@_demo");
  NodeId x = g.input("x", {4, 16});
  // Between ordinary ops, so that a lowered op fuses with its neighbours.
  NodeId y = g.custom_op("@snake@", {{"alpha", 1.5}}, {g.add(x, x)});
  g.add_output(g.relu(y), "y");

  CompiledGraph compiled = Session(Device::Cpu).compile(g);
  std::printf("%s\n", compiled.compile_result().summary().c_str());
  std::printf("@snake@ runs on the CPU through: %s\n",
              std::string(custom_route_name(custom_op_route("@snake@", Device::Cpu))).c_str());

  std::mt19937 rng(0);
  rlx::reference::TensorMap inputs{{"x", random_tensor(DType::F32, {4, 16}, rng)}};
  double err = max_error(compiled.run(inputs), rlx::reference::run(g, inputs));
  std::printf("max error vs the float64 reference: %.3g (%s)\n", err, err <= 1e-4 ? "ok" : "MISMATCH");
  return err <= 1e-4 ? 0 : 1;
} catch (const rlx::Error& e) {
  std::fprintf(stderr, "@snake@: %s\n", e.what());
  return 1;
}
)";

constexpr std::string_view kModelHead = R"(// @Class@: a block for RLX, scaffolded by `rlx @command@ @Class@`.
//
// Fill in:
//   1. emit_layer: the block's math, from FlowCtx's builders (param, linear,
//      matmul, add, mul, residual, activation, rms_norm, cast, ...); ctx.hir()
//      reaches the raw ir::Graph for anything they lack;
//   2. main: the ModelFlow stacking the block, its inputs and your weights.
)";

constexpr std::string_view kModelBody = R"(
// Params are named "<prefix>.<part>.weight" (and ".bias"): instances with
// different prefixes have their own weights, the same prefix shares them.
struct @Class@ : LayerStage {
  std::string prefix;
  std::int64_t hidden;
  @Class@(std::string p, std::int64_t h) : prefix(std::move(p)), hidden(h) {}

  std::string_view name() const override { return "@snake@"; }
  std::pair<FlowValue, StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue x) const override {
    std::int64_t width = x.shape()[x.shape().rank() - 1].size;
    // Placeholder math: a pre-norm MLP with a residual connection.
    FlowValue h = ctx.gelu(ctx.linear(ctx.rms_norm(x, prefix + ".norm"), prefix + ".up", hidden, true));
    FlowValue out = ctx.residual(x, ctx.linear(h, prefix + ".down", width, true));
    return {out, StageArtifacts::hidden_only(out.shape())};
  }
};

int main() try {
  BuiltModel model = ModelFlow::create("@snake@_model")
                         .input("x", {4, 16})
                         .layer_stage(@Class@("layer0", 64))
                         .layer_stage(@Class@("layer1", 64))
                         .build();
  CompiledGraph compiled = Session(Device::Cpu).compile(model.graph);
  std::printf("%s\n", compiled.compile_result().summary().c_str());

  std::mt19937 rng(0);
  rlx::reference::TensorMap inputs, params;
  for (const Node& n : model.graph.nodes()) {
    if (n.op == OpKind::Input) inputs.emplace(n.attrs.get_str("name"), random_tensor(n.dtype, n.shape.extents(), rng));
    if (n.op == OpKind::Param) params.emplace(n.attrs.get_str("name"), random_tensor(n.dtype, n.shape.extents(), rng));
  }
  for (const auto& [name, value] : params) compiled.set_param(name, value);  // your trained weights here

  double err = max_error(compiled.run(inputs), rlx::reference::run(model.graph, inputs, params));
  std::printf("max error vs the float64 reference: %.3g (%s)\n", err, err <= 1e-4 ? "ok" : "MISMATCH");
  return err <= 1e-4 ? 0 : 1;
} catch (const rlx::Error& e) {
  std::fprintf(stderr, "@snake@: %s\n", e.what());
  return 1;
}
)";

ScaffoldFile make(std::string_view name, std::string_view command, std::string_view head, std::string_view body) {
  Names n = names_for(name, command);
  return {n.snake + ".cpp", fill(std::string(head) + std::string(kBuild) + std::string(body), n, command)};
}

}  // namespace

ScaffoldFile scaffold_op(std::string_view name) { return make(name, "new-op", kOpHead, kOpBody); }

ScaffoldFile scaffold_model(std::string_view name) { return make(name, "new-model", kModelHead, kModelBody); }

namespace {

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  if (!in) throw Error("new-op --builtin: cannot read '" + p.string() + "' (is --root the RLX source tree?)");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p);
  out << text;
  if (!out.flush()) throw Error("new-op --builtin: cannot write '" + p.string() + "'");
}

// The row after the last row of `cls` in RLX_OPS, its '\' aligned with the others.
std::string with_row(const std::string& ops, const Names& n, std::string_view cls, std::string_view arity) {
  const std::string tag = ", " + std::string(cls) + ", ";
  const auto last = ops.rfind(tag);
  if (last == std::string::npos) throw Error("new-op --builtin: no " + std::string(cls) + " row in RLX_OPS");
  const auto eol = ops.find('\n', last);
  const auto bol = ops.rfind('\n', last) + 1;
  const auto slash = ops.rfind('\\', eol);
  std::string row = "  X(" + n.cls + ", \"" + n.snake + "\"" + tag + std::string(arity) + ")";
  row.resize(std::max(row.size() + 1, slash - bol), ' ');
  return ops.substr(0, eol + 1) + row + "\\\n" + ops.substr(eol + 1);
}

std::string with_entry(const std::string& family, std::string_view marker, const std::string& entry,
                       const std::filesystem::path& file) {
  const auto at = family.find(marker);
  if (at == std::string::npos)
    throw Error("new-op --builtin: '" + file.string() + "' has no line '" + std::string(marker) + "'");
  const auto bol = family.rfind('\n', at) + 1;
  return family.substr(0, bol) + entry + family.substr(bol);
}

}  // namespace

std::vector<std::filesystem::path> scaffold_builtin_op(std::string_view name, std::string_view kind,
                                                       const std::filesystem::path& root) {
  const Names n = names_for(name, "new-op --builtin");
  if (kind != "unary" && kind != "composite")
    throw Error("new-op --builtin: --kind is unary or composite, got '" + std::string(kind) + "'");
  const std::filesystem::path op_hpp = root / "include/rlx/ir/op.hpp";
  const std::string ops = read_text(op_hpp);
  if (ops.find("\"" + n.snake + "\"") != std::string::npos || ops.find("X(" + n.cls + ",") != std::string::npos)
    throw Error("new-op --builtin: op '" + n.snake + "' (" + n.cls + ") already exists in " + op_hpp.string());
  const bool unary = kind == "unary";
  const std::filesystem::path family = root / (unary ? "src/ops/unary.cpp" : "src/ops/nn.cpp");
  const std::string entry =
      unary
          ? "  formula(OpKind::" + n.cls + ", \"TODO: one line of semantics\", [](Expr x) { return x; /* TODO */ });\n"
          : "  define_op({.kind = OpKind::" + n.cls +
                ",\n"
                "             .doc = \"TODO: one line of semantics\",\n"
                "             .operands = {\"x\"},  // optional ones end in '?'\n"
                "             .attrs = {},  // e.g. {\"eps\", T::Float, false, 1e-5}: the default lives here only\n"
                "             // TODO: the shape rule, the decomposition into primitives and an independent float64\n"
                "             // reference (group_norm above has all three).\n"
                "             .infer = [](const rlx::ir::InferArgs& a) { return a.inputs[0]; },\n"
                "             .decompose = [](const rlx::ir::DecomposeArgs& a) { return a.in[0]; },\n"
                "             .reference = [](const ReferenceArgs& c) { return c.x(0); }});\n";
  const std::string marker =
      unary ? "// `rlx new-op --builtin NAME` adds" : "// `rlx new-op --builtin NAME --kind composite`";
  const std::string family_text = with_entry(read_text(family), marker, entry, family);
  write_text(op_hpp, with_row(ops, n, unary ? "Unary" : "Composite", "1, 1"));
  write_text(family, family_text);
  return {op_hpp, family};
}

std::filesystem::path write_scaffold(const ScaffoldFile& file, const std::filesystem::path& dir) {
  std::filesystem::path path = dir / file.filename;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("cannot create directory '" + dir.string() + "': " + ec.message());
  if (std::filesystem::exists(path)) throw Error("'" + path.string() + "' already exists; not overwriting it");
  std::ofstream out(path);
  out << file.text;
  if (!out.flush()) throw Error("cannot write '" + path.string() + "'");
  return path;
}

}  // namespace rlx::tools
