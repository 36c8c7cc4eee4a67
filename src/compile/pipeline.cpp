// The pass manager: HIR -> MIR -> LIR, with a record, an inspect callback and
// an optional stderr dump after every pass, plus the reports' text forms.
#include "rlx/compile/pipeline.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <set>
#include <utility>

#include "rlx/compile/passes_extra.hpp"
#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/ir/dim_expr.hpp"
#include "rlx/ir/op_def.hpp"
#include "rlx/ir/text.hpp"

namespace rlx::compile {

std::int64_t Buffer::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}
std::int64_t Buffer::nbytes() const { return std::int64_t(ir::storage_bytes(dtype, shape)); }

BufferId Kernel::input_buffer(const ir::Node& input) const {
  return inputs.at(std::stoul(input.attrs.get_str("name").substr(2)));  // lower_to_lir names them "in<i>"
}

bool is_head_layout_permute(const ir::Node& n) {
  if (n.op != ir::OpKind::Permute || n.shape.rank() != 4) return false;
  const auto& perm = n.attrs.get_ints("perm");
  return perm.size() == 4 && perm[3] == 3;
}

bool attention_views(const LirModule& lir, const Kernel& k, AttentionViews* out, std::string* why) {
  const ir::Graph& body = k.body;
  AttentionViews a;
  for (const auto& n : body.nodes())
    if (n.op == ir::OpKind::Attention) {
      if (a.op) return *why = "two attentions in the kernel", false;
      a.op = &n;
    } else if (n.op != ir::OpKind::Input && n.op != ir::OpKind::Permute) {
      return *why = "the kernel also computes " + std::string(ir::op_name(n.op)), false;
    }
  if (!a.op) return *why = "no attention in the kernel", false;
  if (k.outputs.size() != 1 || body.outputs().size() != 1) return *why = "the kernel has several outputs", false;
  auto contiguous = [](StridedOperand* s) {
    if (s->shape.size() != 4) return;
    const auto st = ir::contiguous_strides(s->shape);
    std::copy(st.begin(), st.end(), s->strides);
  };
  StridedOperand* operands[3] = {&a.q, &a.k, &a.v};
  for (std::size_t i = 0; i < a.op->inputs.size(); ++i) {
    const ir::Node& n = body.node(a.op->inputs[i]);
    if (i == 3) {  // the mask: a buffer
      if (n.op != ir::OpKind::Input) return *why = "the mask is computed inside the kernel", false;
      a.mask = k.input_buffer(n);
      continue;
    }
    StridedOperand& s = *operands[i];
    s.shape = n.shape.extents();
    if (n.op == ir::OpKind::Input) {
      s.buffer = k.input_buffer(n);
      contiguous(&s);
    } else if (is_head_layout_permute(n) && body.node(n.inputs[0]).op == ir::OpKind::Input) {
      // View dim d is the buffer's dim perm[d].
      s.buffer = k.input_buffer(body.node(n.inputs[0]));
      const auto st = ir::contiguous_strides(lir.buffer(s.buffer).shape);
      const auto& perm = n.attrs.get_ints("perm");
      for (std::size_t d = 0; d < 4; ++d) s.strides[d] = st[std::size_t(perm[d])];
    } else {
      return *why = "an operand is computed inside the kernel", false;
    }
  }
  const ir::Node& o = body.node(body.outputs()[0].node);
  a.out.buffer = k.outputs[0];
  a.out.shape = a.op->shape.extents();
  if (o.id == a.op->id) {
    contiguous(&a.out);
  } else if (is_head_layout_permute(o) && o.inputs[0] == a.op->id) {
    // The buffer holds permute(attention): its dim d is the attention's dim perm[d].
    const auto st = ir::contiguous_strides(o.shape.extents());
    const auto& perm = o.attrs.get_ints("perm");
    for (std::size_t d = 0; d < 4; ++d) a.out.strides[std::size_t(perm[d])] = st[d];
  } else {
    return *why = "the kernel's output is not the attention's result", false;
  }
  *out = a;
  return true;
}

std::string_view kernel_kind_name(KernelKind k) {
  switch (k) {
    case KernelKind::Elementwise: return "elementwise";
    case KernelKind::Reduce: return "reduce";
    case KernelKind::MatMul: return "matmul";
    case KernelKind::Movement: return "movement";
    case KernelKind::Native: return "native";
    case KernelKind::Leaf: return "leaf";
    case KernelKind::ControlFlow: return "control_flow";
  }
  return "?";
}

std::string_view dispatch_tier_name(DispatchTier t) {
  switch (t) {
    case DispatchTier::Native: return "native";
    case DispatchTier::Decomposed: return "decomposed";
    case DispatchTier::Rewritten: return "rewritten";
    case DispatchTier::HostFallback: return "host_fallback";
    case DispatchTier::Unsupported: return "unsupported";
  }
  return "?";
}

namespace {

std::string shape_str(ir::DType t, const std::vector<std::int64_t>& shape) {
  return fmt::format("{}{}", ir::dtype_name(t), ir::Shape(shape).str());
}

std::string bytes_str(std::int64_t b) {
  if (b < 1024) return fmt::format("{} B", b);
  if (b < 1024 * 1024) return fmt::format("{:.1f} KiB", double(b) / 1024);
  return fmt::format("{:.1f} MiB", double(b) / (1024.0 * 1024.0));
}

std::string_view role_name(BufferRole r) {
  switch (r) {
    case BufferRole::Input: return "input";
    case BufferRole::Param: return "param";
    case BufferRole::Constant: return "constant";
    case BufferRole::Arena: return "arena";
  }
  return "?";
}

std::string buffer_list(const std::vector<BufferId>& ids) {
  std::string s;
  for (auto id : ids) s += fmt::format("{}b{}", s.empty() ? "" : ", ", id);
  return s;
}

}  // namespace

std::string LirModule::to_text() const {
  std::string out = fmt::format("lir {} {{\n  buffers:\n", name);
  for (const auto& b : buffers) {
    out += fmt::format("    b{} {} \"{}\" {}", b.id, role_name(b.role), b.name, shape_str(b.dtype, b.shape));
    if (b.root != b.id)
      out += fmt::format(" = view of b{} +{}", b.root, b.view_offset);
    else if (b.role == BufferRole::Arena)
      out += fmt::format(" @{} ({})", b.arena_offset, bytes_str(b.nbytes()));
    else
      out += fmt::format(" #{}", b.external_index);
    out += '\n';
  }
  for (const auto& k : kernels) {
    out += fmt::format("  {}\n    ({}) -> ({})\n", k.name, buffer_list(k.inputs), buffer_list(k.outputs));
    auto body = ir::to_text(k.body);
    for (std::size_t pos = 0; pos < body.size();) {
      auto nl = body.find('\n', pos);
      if (nl == std::string::npos) nl = body.size();
      out += "    " + body.substr(pos, nl - pos) + '\n';
      pos = nl + 1;
    }
  }
  out += "  outputs:";
  for (std::size_t i = 0; i < outputs.size(); ++i)
    out += fmt::format("{} b{} \"{}\"", i ? "," : "", outputs[i], i < output_names.size() ? output_names[i] : "");
  out += fmt::format("\n  memory: arena {} (naive {}), {} views, alignment {}\n}}\n", bytes_str(memory.arena_bytes),
                     bytes_str(memory.naive_bytes), memory.view_count, memory.alignment);
  return out;
}

std::string DispatchReport::to_text() const {
  std::size_t wop = 2, wtier = 4;
  for (const auto& e : entries) {
    wop = std::max(wop, ir::op_name(e.op).size());
    wtier = std::max(wtier, dispatch_tier_name(e.tier).size());
  }
  std::string out = fmt::format("dispatch on {} ({} ops)\n", backend, entries.size());
  out += fmt::format("  {:<6} {:<{}} {:<{}} {}\n", "node", "op", wop, "tier", wtier, "reason");
  for (const auto& e : entries)
    out += fmt::format("  {:<6} {:<{}} {:<{}} {}\n", fmt::format("%{}", e.hir_node), ir::op_name(e.op), wop,
                       dispatch_tier_name(e.tier), wtier, e.reason);
  return out;
}

std::string CompileResult::summary() const {
  std::string out = fmt::format("compile '{}' for {}: {} HIR nodes -> {} MIR nodes -> {} kernels in {:.2f} ms\n",
                                hir.name(), dispatch.backend, hir.size(), mir.size(), lir.kernels.size(), total_millis);
  constexpr std::size_t kinds = std::size_t(KernelKind::ControlFlow) + 1;
  std::size_t per_kind[kinds] = {}, ops = 0, fused_kernels = 0;
  for (const auto& k : lir.kernels) {
    ++per_kind[std::size_t(k.kind)];
    ops += k.source_nodes.size();
    fused_kernels += k.source_nodes.size() > 1;
  }
  out += "  kernels:";
  bool first = true;
  for (std::size_t i = 0; i < kinds; ++i) {
    if (!per_kind[i]) continue;
    out += fmt::format("{} {} {}", first ? "" : ",", per_kind[i], kernel_kind_name(KernelKind(i)));
    first = false;
  }
  out += fmt::format("{}\n  fusion: {} ops in {} kernels, {} kernels fuse several ops\n", first ? " none" : "", ops,
                     lir.kernels.size(), fused_kernels);
  const auto& mem = lir.memory;
  double saved = mem.naive_bytes ? 100.0 * double(mem.naive_bytes - mem.arena_bytes) / double(mem.naive_bytes) : 0.0;
  out += fmt::format("  memory: arena {} vs {} naive ({:.1f}% saved), {} views\n", bytes_str(mem.arena_bytes),
                     bytes_str(mem.naive_bytes), saved, mem.view_count);
  return out;
}

// ---- user pass registry ----------------------------------------------------

namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::vector<std::shared_ptr<const Pass>>& registry() {
  static std::vector<std::shared_ptr<const Pass>> passes;
  return passes;
}
}  // namespace

void register_ir_pass(std::shared_ptr<const Pass> pass) {
  if (!pass) throw Error("register_ir_pass: null pass");
  std::lock_guard lock(registry_mutex());
  registry().push_back(std::move(pass));
}

std::vector<std::shared_ptr<const Pass>> registered_ir_passes() {
  std::lock_guard lock(registry_mutex());
  return registry();
}

// ---- the pipeline -----------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;
double millis_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// What to print to stderr: CompileOptions::dump, else $RLX_DUMP (the only
// place the environment is read).
// The levels and passes a dump may name: a typo is an error, not a silent no-dump.
constexpr std::string_view kDumpable[] = {"hir",
                                          "mir",
                                          "lir",
                                          "all",
                                          "lower_control_flow",
                                          "inline",
                                          "param_specialize",
                                          "decompose",
                                          "precision",
                                          "quant_propagate",
                                          "legalize_f32_compute",
                                          "legalize_dtypes",
                                          "legalize_broadcast",
                                          "const_fold",
                                          "algebraic_simplify",
                                          "cse",
                                          "dce",
                                          "promote_params",
                                          "verify",
                                          "lower_to_lir",
                                          "plan_memory"};

std::set<std::string, std::less<>> dump_names(const CompileOptions& o) {
  std::set<std::string, std::less<>> names;
  std::string_view source = "CompileOptions::dump";
  if (o.dump.empty()) {
    auto env = env::get_list("RLX_DUMP");
    names = {env.begin(), env.end()};
    source = "RLX_DUMP";
  }
  for (std::size_t pos = 0; pos <= o.dump.size() && !o.dump.empty();) {
    auto comma = std::min(o.dump.find(',', pos), o.dump.size());
    auto item = o.dump.substr(pos, comma - pos);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) names.insert(item);
    pos = comma + 1;
  }
  for (const auto& n : names) {
    if (std::find(std::begin(kDumpable), std::end(kDumpable), n) != std::end(kDumpable)) continue;
    const auto& user = registered_ir_passes();
    if (std::any_of(user.begin(), user.end(), [&](const auto& p) { return p->name() == n; })) continue;
    std::string known;
    for (auto k : kDumpable) known += (known.empty() ? "" : ", ") + std::string(k);
    for (const auto& p : user) known += ", " + std::string(p->name());
    throw Error(fmt::format("{}: unknown level or pass '{}' to dump (known: {})", source, n, known));
  }
  return names;
}

class PassManager {
 public:
  PassManager(CompileResult& res, const CompileOptions& opt) : res_(res), opt_(opt), dump_(dump_names(opt)) {}

  bool dumps(std::string_view what) const { return dump_.contains(what) || dump_.contains("all"); }
  void dump(std::string_view what, const std::string& text) const {
    if (dumps(what)) fmt::print(stderr, "// ---- rlx dump: {} ----\n{}", what, text);
  }

  // Runs one pass over `g` (replacing it) and records it.
  template <class F>
  void run(std::string_view name, ir::Graph& g, F&& pass) {
    auto t0 = Clock::now();
    auto before = g.size();
    g = guarded(name, [&] { return pass(std::as_const(g)); });
    res_.passes.push_back({std::string(name), before, g.size(), millis_since(t0)});
    if (opt_.inspect) opt_.inspect(name, g);
    if (dumps(name)) dump(name, ir::to_text(g));
  }

  // Runs `f`, naming the pass in any rlx::Error it throws.
  template <class F>
  auto guarded(std::string_view name, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const Error& e) {
      throw Error(fmt::format("pass '{}': {}", name, e.what()));
    }
  }

  void record(std::string_view name, std::size_t before, std::size_t after, Clock::time_point t0) {
    res_.passes.push_back({std::string(name), before, after, millis_since(t0)});
  }

 private:
  CompileResult& res_;
  const CompileOptions& opt_;
  std::set<std::string, std::less<>> dump_;
};

void require_static(const ir::Graph& g) {
  std::set<std::string, std::less<>> syms;  // the symbols, also those inside expressions such as B*S
  const ir::Node* example = nullptr;
  for (const auto& n : g.nodes())
    for (const auto& d : n.shape.dims())
      if (!d.is_static()) {
        ir::DimExpr::of(d).symbols(syms);
        if (!example) example = &n;
      }
  if (syms.empty()) return;
  std::string names;
  for (const auto& s : syms) names += (names.empty() ? "" : ", ") + s;
  throw Error(fmt::format(
      "graph '{}' has unbound symbolic dims {} (e.g. {} is {}{}); bind them with "
      "CompileOptions::bind",
      g.name(), names, ir::describe_node(g, *example), ir::dtype_name(example->dtype), example->shape.str()));
}

}  // namespace

CompileResult compile(const ir::Graph& hir, const BackendTraits& backend, const CompileOptions& options) {
  auto start = Clock::now();
  hir.verify();
  CompileResult res{.hir = hir, .mir = ir::Graph(hir.name()), .lir = {}, .passes = {}, .dispatch = {}, .fusion = {}};
  res.dispatch.backend = backend.name;
  PassManager pm(res, options);
  ir::Graph g = options.bind.empty() ? hir : ir::bind_symbols(hir, options.bind);
  require_static(g);
  pm.dump("hir", ir::to_text(g));

  if (std::any_of(g.nodes().begin(), g.nodes().end(), [](const ir::Node& n) { return ir::is_control_flow(n.op); }))
    pm.run("lower_control_flow", g,
           [&](const ir::Graph& x) { return passes::lower_control_flow(x, options, backend, &res.dispatch); });
  const auto has_custom = [](const ir::Graph& x) {
    return std::any_of(x.nodes().begin(), x.nodes().end(),
                       [](const ir::Node& n) { return n.op == ir::OpKind::Custom; });
  };
  if (has_custom(g))
    pm.run("inline", g,
           [&](const ir::Graph& x) { return passes::inline_custom(x, backend.custom_kernels, &res.dispatch); });
  if (!options.param_bindings.empty())
    pm.run("param_specialize", g,
           [&](const ir::Graph& x) { return passes::param_specialize(x, options.param_bindings); });
  const NativeOps& keep = backend.native_ops;  // what decompose leaves alone
  // Composites to primitives, then the backend's dtype and broadcast rules. Runs once here, and again
  // after user passes that emit custom ops or composites, so their output is lowered too (seed extending.md §2b).
  // The precision pass runs once, on the first primitives (the matmuls of decomposed linears and attention).
  bool precision_done = options.precision == Precision::F32;
  res.precision.policy = options.precision;
  bool quant_done = !(options.optimize && options.quant_propagate);
  const auto legalize = [&] {
    pm.run("decompose", g, [&](const ir::Graph& x) { return passes::decompose(x, keep, &res.dispatch); });
    if (!precision_done) {
      pm.run("precision", g, [&](const ir::Graph& x) {
        return passes::auto_mixed_precision(x, options.precision, backend, &res.precision);
      });
      precision_done = true;
    }
    // quant_propagate, once, on the first primitives (before legalize_broadcast expands its scalars).
    if (!quant_done) {
      quant_done = true;
      if (passes::has_quantize(g))
        pm.run("quant_propagate", g, [&](const ir::Graph& x) {
          return passes::quant_propagate(x, options.param_bindings, &res.precision.quant_propagate);
        });
    }
    if (!backend.f32_compute_ops.empty())
      pm.run("legalize_f32_compute", g,
             [&](const ir::Graph& x) { return passes::legalize_f32_compute(x, backend.f32_compute_ops); });
    if (std::any_of(std::begin(ir::kAllDTypes), std::end(ir::kAllDTypes),
                    [&](ir::DType t) { return ir::is_float(t) && !backend.native_dtypes.contains(t); }))
      pm.run("legalize_dtypes", g,
             [&](const ir::Graph& x) { return passes::legalize_dtypes(x, backend.native_dtypes); });
    pm.run("legalize_broadcast", g, passes::legalize_broadcast);
  };
  legalize();
  if (options.optimize) {
    pm.run("const_fold", g, passes::const_fold);
    pm.run("algebraic_simplify", g, passes::algebraic_simplify);
    pm.run("cse", g, passes::cse);
    pm.run("dce", g, passes::dce);
  }
  if (options.promote_constants_over_bytes > 0)
    pm.run("promote_params", g, [&](const ir::Graph& x) {
      auto promoted = passes::promote_params_with_values(x, options.promote_constants_over_bytes);
      res.promoted_params = std::move(promoted.values);
      return std::move(promoted.graph);
    });
  const auto user_passes = registered_ir_passes();
  for (const auto& p : user_passes) pm.run(p->name(), g, [&](const ir::Graph& x) { return p->run(x); });
  const bool needs_lowering = std::any_of(g.nodes().begin(), g.nodes().end(), [&](const ir::Node& n) {
    return n.op == ir::OpKind::Custom ||
           ((ir::op_info(n.op).cls == ir::OpClass::Composite || ir::op_def(n.op).has_decomposition()) &&
            !keep.contains(n.op));
  });
  if (!user_passes.empty() && needs_lowering) {
    if (has_custom(g))
      pm.run("inline", g,
             [&](const ir::Graph& x) { return passes::inline_custom(x, backend.custom_kernels, &res.dispatch); });
    legalize();
  }
  auto t0 = Clock::now();
  pm.guarded("verify", [&] { g.verify(); });
  pm.record("verify", g.size(), g.size(), t0);
  pm.dump("mir", ir::to_text(g));

  BackendTraits traits = backend;
  if (!options.fusion) traits.fuse_elementwise = traits.fuse_reduce = traits.fuse_matmul_epilogue = false;
  t0 = Clock::now();
  res.lir = pm.guarded("lower_to_lir", [&] { return passes::lower_to_lir(g, traits, &res.fusion); });
  pm.record("lower_to_lir", g.size(), res.lir.kernels.size(), t0);
  t0 = Clock::now();
  pm.guarded("plan_memory",
             [&] { passes::plan_memory(res.lir, backend.arena_alignment, backend.arena_reuse_across_dtypes); });
  pm.record("plan_memory", res.lir.kernels.size(), res.lir.kernels.size(), t0);
  pm.dump("lir", res.lir.to_text());
  res.mir = std::move(g);
  res.total_millis = millis_since(start);
  return res;
}

}  // namespace rlx::compile
