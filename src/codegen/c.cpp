// The C target. emit(graph) compiles the graph for codegen::c::traits() and
// emits C from the LIR (rlx/compile/lir.hpp): one static function per kernel,
// called in the LIR's order, over the LIR's one memory plan. A fused kernel is
// one loop nest computing its whole chain per element in scalar locals; loop
// nests walk row-major buffers with strides baked in as constants, so the
// code needs no shape metadata at run time.
//
// Storage: inputs and params are the caller's pointers (or baked arrays),
// constants static arrays, views pointers into their root, and arena buffers
// sit at the plan's offsets in one workspace, except that the first output
// covering an arena buffer whole is that buffer: its kernel writes the
// caller's memory. The plan is made without reuse across dtypes, so no byte
// of the workspace changes its effective type and the code stays within C's
// aliasing rules at -O2.
#include "rlx/codegen/c.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "codegen/c_text.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/op_def.hpp"

namespace rlx::codegen::c {
namespace {

using compile::Buffer;
using compile::BufferId;
using compile::BufferRole;
using compile::Kernel;
using compile::KernelKind;
using compile::LirModule;
using ir::DType;
using ir::Node;
using ir::NodeId;
using ir::OpClass;
using ir::OpKind;
using i64 = std::int64_t;
using Ints = std::vector<i64>;
using text::Helper;
using text::kCudaPrelude;
using text::kHelpers;
using text::kPhaseMarker;

class Code {
 public:
  void line(std::string_view s) {
    if (!s.empty()) out_.append(2 * std::size_t(depth_), ' ').append(s);
    out_.push_back('\n');
  }
  void open(std::string_view s) {
    line(s.empty() ? std::string("{") : std::string(s) + " {");
    ++depth_;
  }
  void close(int n = 1) {
    for (; n > 0; --n) {
      --depth_;
      line("}");
    }
  }
  const std::string& str() const { return out_; }
  int depth() const { return depth_; }

 private:
  std::string out_;
  int depth_ = 0;
};

// ---- literals and names ---------------------------------------------------

std::string float_literal(double v, DType t) {
  if (std::isnan(v)) return "NAN";
  if (std::isinf(v)) return v > 0 ? "INFINITY" : "-INFINITY";
  char buf[40];
  std::snprintf(buf, sizeof buf, t == DType::F32 ? "%.9g" : "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return t == DType::F32 ? s + "f" : s;
}

std::string int_literal(i64 v) {
  if (v == std::numeric_limits<i64>::min()) return "-9223372036854775807LL - 1";
  std::string s = std::to_string(v);
  return v > std::numeric_limits<std::int32_t>::max() || v < std::numeric_limits<std::int32_t>::min() ? s + "LL" : s;
}

std::string literal(double v, DType t) {
  if (ir::is_float(t)) return float_literal(v, t);
  if (t == DType::Bool) return v != 0 ? "1" : "0";
  return int_literal(static_cast<i64>(v));
}

// i64 elements are read raw: Tensor::get goes through double and would round
// values beyond 2^53.
std::string element_literal(const ir::Tensor& t, i64 i) {
  return t.dtype() == DType::I64 ? int_literal(t.data_as<std::int64_t>()[i]) : literal(t.get(i), t.dtype());
}

// An operand spliced into a larger expression.
std::string operand(std::string s) { return !s.empty() && s[0] == '-' ? "(" + s + ")" : s; }

// u8 and bool share one workspace pool: both are uint8_t.
DType pool_of(DType t) { return t == DType::Bool ? DType::U8 : t; }

std::string pool_suffix(DType t) {
  switch (pool_of(t)) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::I8: return "i8";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    default: return "u8";
  }
}

// The C type of a dtype; f16 and bf16 only exist in the CUDA dialect (the prelude's storage types, which
// convert to and from float), and the C target rejects them before emitting.
std::string_view ctype(DType t) {
  if (t == DType::F16) return "rlx_f16";
  if (t == DType::BF16) return "rlx_bf16";
  return c_type(t);
}

// C keywords, the library names the emitted code calls, and the names of its
// locals: an argument named like one of them gets a trailing '_'.
const std::set<std::string, std::less<>>& reserved_names() {
  static const std::set<std::string, std::less<>> names = {
      "auto",      "break",      "case",     "char",     "const",     "continue", "default",   "do",     "double",
      "else",      "enum",       "extern",   "float",    "for",       "goto",     "if",        "inline", "int",
      "long",      "register",   "restrict", "return",   "short",     "signed",   "sizeof",    "static", "struct",
      "switch",    "typedef",    "union",    "unsigned", "void",      "volatile", "while",     "int8_t", "uint8_t",
      "int32_t",   "int64_t",    "uint64_t", "memcpy",   "NAN",       "INFINITY", "isnan",     "exp",    "expf",
      "log",       "logf",       "log1p",    "log1pf",   "sqrt",      "sqrtf",    "tanh",      "tanhf",  "erf",
      "erff",      "sin",        "sinf",     "cos",      "cosf",      "floor",    "floorf",    "ceil",   "ceilf",
      "nearbyint", "nearbyintf", "fabs",     "fabsf",    "pow",       "powf",     "fmax",      "fmaxf",  "fmin",
      "fminf",     "fmod",       "fmodf",    "copysign", "copysignf", "trunc",    "workspace", "acc",    "best",
      "row",       "ra",         "rb",       "k",        "at",        "val"};
  return names;
}

// The generated function is a global symbol: it must not clash with the C
// library it links against.
bool is_libc_name(std::string_view s) {
  static const std::set<std::string, std::less<>> names = [] {
    std::set<std::string, std::less<>> out = {
        "main",  "abs",    "labs",     "llabs",   "div",        "malloc", "calloc", "realloc", "free",   "exit",
        "abort", "memcpy", "memmove",  "memset",  "memcmp",     "strlen", "strcpy", "strcmp",  "printf", "puts",
        "isnan", "isinf",  "isfinite", "signbit", "fpclassify", "nan",    "nanf",   "nanl"};
    for (std::string_view m :
         {"acos",   "asin",     "atan",      "atan2",      "cos",     "sin",   "tan",       "acosh",
          "asinh",  "atanh",    "cosh",      "sinh",       "tanh",    "exp",   "exp2",      "expm1",
          "frexp",  "ilogb",    "ldexp",     "log",        "log10",   "log1p", "log2",      "logb",
          "modf",   "scalbn",   "scalbln",   "cbrt",       "fabs",    "hypot", "pow",       "sqrt",
          "erf",    "erfc",     "lgamma",    "tgamma",     "ceil",    "floor", "nearbyint", "rint",
          "lrint",  "llrint",   "round",     "lround",     "llround", "trunc", "fmod",      "remainder",
          "remquo", "copysign", "nextafter", "nexttoward", "fdim",    "fmax",  "fmin",      "fma"})
      for (std::string_view suffix : {"", "f", "l"}) out.insert(std::string(m) + std::string(suffix));
    return out;
  }();
  return names.contains(s);
}

bool is_local_name(std::string_view s) {  // v<id>, i<d>, r<d>, ws_<pool>
  if (s.starts_with("ws_") || s.starts_with("rlx_")) return true;
  return s.size() > 1 && (s[0] == 'v' || s[0] == 'i' || s[0] == 'r') &&
         std::all_of(s.begin() + 1, s.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); });
}

std::string identifier(std::string_view name, std::set<std::string, std::less<>>& taken) {
  std::string s;
  for (char ch : name) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '_') s = "t" + s;
  while (reserved_names().contains(s) || is_local_name(s) || taken.contains(s)) s += '_';
  taken.insert(s);
  return s;
}

std::string type_text(DType t, const Ints& shape) {
  std::string s = std::string(ir::dtype_name(t)) + "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(i64(shape[i]));
  return s + "]";
}

i64 numel(const Ints& e) {
  i64 n = 1;
  for (auto d : e) n *= d;
  return n;
}

// Strides reading a tensor of extents `in` broadcast (NumPy rules) to `out`.
Ints broadcast_strides(const Ints& in, const Ints& out) {
  if (in.size() > out.size()) throw Error("codegen::c: a kernel operand has a higher rank than its loop nest");
  Ints s(out.size(), 0), cs = ir::contiguous_strides(in);
  std::size_t lead = out.size() - in.size();
  for (std::size_t i = 0; i < in.size(); ++i)
    if (in[i] != 1) s[lead + i] = cs[i];
  return s;
}

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

// ---- the emitter -----------------------------------------------------------

struct Walk {
  Ints strides;
  i64 base = 0;
};
struct Nest {
  std::vector<std::string> off;  // per walk: the offset expression inside the loops
  int depth = 0;
};
struct Merged {
  Ints e;               // the loop extents left
  std::vector<Ints> s;  // per walk: its stride in each of them
};
Merged merge_dims(const Ints& ext, const std::vector<Walk>& walks);

Ints extents(const Node& n) { return n.shape.extents(); }

// "a + b" without "+ 0" noise; for a pointer plus an offset or two offsets.
std::string plus(const std::string& a, const std::string& b) { return b == "0" ? a : a == "0" ? b : a + " + " + b; }

// Whether the code in `text` names the identifier `name` (not as part of a
// longer one, nor inside a comment).
bool mentions(const std::string& text, const std::string& name) {
  auto ident = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  for (std::size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
    const std::size_t open = text.rfind("/*", at);
    if (open != std::string::npos && text.find("*/", open) > at) continue;
    if ((at == 0 || !ident(text[at - 1])) && (at + name.size() == text.size() || !ident(text[at + name.size()])))
      return true;
  }
  return false;
}

// Text inside a C comment: a name holding "*/" must not end it.
std::string comment_text(std::string s) { return replace_all(std::move(s), "*/", "* /"); }

// A parameter list; one per line past four, or past 100 columns.
std::string param_list(const std::string& head, const std::vector<std::string>& args) {
  std::string s = head + "(", pad(s.size(), ' ');
  std::size_t width = s.size();
  for (const auto& a : args) width += a.size() + 2;
  const bool wrap = args.size() > 4 || width > 100;
  for (std::size_t i = 0; i < args.size(); ++i) s += (i ? (wrap ? ",\n" + pad : ", ") : "") + args[i];
  return s + (args.empty() ? "void)" : ")");
}

class Emitter {
 public:
  Emitter(const LirModule& m, const Options& o, std::string fn) : m_(m), o_(o) { src_.function_name = std::move(fn); }
  Source run();
  // The CUDA dialect (emit_cuda): every kernel's phases in one source.
  CudaModule cuda(const CudaOptions& options);

 private:
  // The module: arguments, where each buffer lives, one function per kernel.
  void arguments();
  std::string pointer(BufferId id);
  const std::string& root_pointer(const Buffer& root);
  std::string describe(BufferId id) const;
  void static_array(const std::string& what, const std::string& name, const ir::Tensor& t);
  void kernel(const Kernel& k, std::size_t index);
  std::string kernel_body(const Kernel& k);
  std::string signature() const;
  std::string helpers() const;

  // One kernel's body, `g_`: a loop nest per kernel, the fused nodes as scalar locals inside it.
  void elementwise();
  void reduce(const Node& anchor);
  void matmul(const Node& anchor);
  void movement(const Node& n);
  void leaf_fill(const Node& n);
  void row_op(const Node& n);                // the CUDA dialect's native softmax and norms (c_cuda.inc)
  void rope(const Node& n);                  // the CUDA dialect's native rope (c_cuda.inc)
  void dynamic_update_slice(const Node& n);  // and dynamic_update_slice (c_cuda.inc)
  void copy(const Node& n, NodeId src, const Ints& ext, const Walk& from, const Walk& to);
  void concat(const Node& n);
  void pad(const Node& n);
  void indexed(const Node& n);
  void compute(const std::vector<NodeId>& nodes);
  void store_outputs(const std::string& off);
  std::string value(NodeId id) const;
  std::string expr(const Node& n, const std::vector<std::string>& a);
  std::string ptr(NodeId id) const;  // movement and leaf kernels: a body node's pointer parameter
  Nest open_nest(const Ints& ext, const std::vector<Walk>& walks, char var);
  // The CUDA dialect's vector phases (see vector_phase).
  struct VecOperand {
    std::string ptr;  // the pointer it is read from or written to
    DType t;
    i64 align;  // bytes its address is known to be a multiple of
    std::size_t walk;
    NodeId node;  // the body node it holds (an input) or stores (an output)
    bool out;
  };
  bool vector_phase(const Ints& ext, const std::vector<Walk>& walks, const std::vector<VecOperand>& ops,
                    const std::vector<NodeId>& nodes);
  i64 alignment_of(BufferId id) const;
  std::string use(std::string_view helper, DType t = DType::F64);
  const Node& in(const Node& n, std::size_t i) const { return g_->node(n.inputs[i]); }
  [[noreturn]] void fail(const Node& n, const std::string& why) const {
    throw Error("codegen::c: " + k_->name + ": " + ir::describe_node(*g_, n) + ": " + why);
  }

  const LirModule& m_;
  const Options& o_;
  Source src_;
  std::vector<std::string> root_;   // per root buffer: its pointer in the function, once referenced
  std::vector<int> direct_;         // per root buffer: the output computed straight into it, or -1
  std::vector<std::string> baked_;  // per param: its static array, when baked
  std::set<DType> arena_types_;     // C types the static arena is read as
  std::set<std::string> helpers_;
  Code statics_, kernels_, arena_, calls_, body_;
  // The kernel being emitted.
  const Kernel* k_ = nullptr;
  const ir::Graph* g_ = nullptr;
  std::vector<std::string> read_;  // per body node: its value at the current loop point
  // The CUDA dialect: each top-level nest is a phase spread over the grid; serial_next_ makes the next
  // phase run on one thread (an accumulation whose targets may repeat).
  bool cuda_ = false;
  bool serial_next_ = false;
  // The CUDA dialect's matmul epilogues: the product is read from `rlx_prod` (a library GEMM's result) instead
  // of computed; matmul() says whether the kernel's one output is the product itself.
  bool product_input_ = false;
  bool product_is_output_ = false;
  // The CUDA dialect's reductions: a warp per output element. lanes_ makes the next phase run 32 threads per
  // iteration (rlx_lane their index), lane_loop_ the next inner nest one loop strided over the lanes.
  bool lanes_ = false;
  bool lane_loop_ = false;
  // The CUDA dialect's alignment facts and vector width (CudaOptions).
  const CudaOptions* cuda_options_ = nullptr;
  std::string phase_pragma_;  // put before the next phase's grid-stride loop
};

void Emitter::arguments() {
  std::set<std::string, std::less<>> taken;
  auto arg = [&](const std::string& name, const Buffer& b) {
    return Arg{name, identifier(name, taken), b.dtype, b.shape};
  };
  for (auto id : m_.inputs) src_.inputs.push_back(arg(m_.buffer(id).name, m_.buffer(id)));
  // Which roots the kernels and outputs touch: only those baked params need a value.
  std::vector<bool> used(m_.buffers.size(), false);
  for (const Kernel& k : m_.kernels)
    for (const auto* ids : {&k.inputs, &k.outputs})
      for (auto id : *ids) used[std::size_t(m_.buffer(id).root)] = true;
  for (auto id : m_.outputs) used[std::size_t(m_.buffer(id).root)] = true;
  std::set<std::string, std::less<>> baked, baked_names;
  for (auto id : m_.params) {
    const Buffer& b = m_.buffer(id);
    baked_.emplace_back();
    if (o_.params == ParamMode::Pointers) {
      src_.params.push_back(arg(b.name, b));
      continue;
    }
    baked.insert(b.name);
    if (!used[std::size_t(id)]) continue;
    auto it = o_.param_values.find(b.name);
    if (it == o_.param_values.end())
      throw Error("codegen::c: param '" + b.name +
                  "' has no value; ParamMode::Baked needs every param in Options::param_values");
    const ir::Tensor& t = it->second;
    if (t.dtype() != b.dtype || t.shape() != b.shape)
      throw Error("codegen::c: param '" + b.name + "' is " + type_text(b.dtype, b.shape) + " but its baked value is " +
                  type_text(t.dtype(), t.shape()));
    baked_.back() = "rlx_p_" + identifier(b.name, baked_names);
  }
  for (const auto& [name, t] : o_.param_values)
    if (o_.params == ParamMode::Baked && !baked.contains(name))
      throw Error("codegen::c: Options::param_values names '" + name + "', which is not a param of graph '" + m_.name +
                  "'");
  direct_.assign(m_.buffers.size(), -1);
  for (std::size_t j = 0; j < m_.outputs.size(); ++j) {
    const Buffer& b = m_.buffer(m_.outputs[j]);
    const std::string& name = j < m_.output_names.size() ? m_.output_names[j] : std::string();
    src_.outputs.push_back(arg(name.empty() ? "out" + std::to_string(j) : name, b));
    // The first output covering an arena root whole is that root: its kernel writes the caller's memory.
    const Buffer& root = m_.buffer(b.root);
    if (root.role == BufferRole::Arena && b.view_offset == 0 && b.nbytes() == root.nbytes() &&
        direct_[std::size_t(root.id)] < 0)
      direct_[std::size_t(root.id)] = int(j);
  }
}

void Emitter::static_array(const std::string& what, const std::string& name, const ir::Tensor& t) {
  std::string init;
  for (i64 i = 0; i < t.numel(); ++i) init += (i ? (i % 8 ? ", " : ",\n    ") : "") + element_literal(t, i);
  statics_.line("/* " + comment_text(what + " " + type_text(t.dtype(), t.shape())) + " */");
  // C has no empty arrays: an empty tensor still gets one (unread) element.
  statics_.line("static const " + std::string(ctype(t.dtype())) + " " + name + "[" +
                std::to_string(std::max<i64>(t.numel(), 1)) + "] = {\n    " + (init.empty() ? "0" : init) + "};");
}

// The pointer a root buffer is known by in the function: an argument, a
// static array, or a place in the arena (declared on first use).
const std::string& Emitter::root_pointer(const Buffer& r) {
  std::string& name = root_[std::size_t(r.id)];
  if (!name.empty()) return name;
  const auto index = std::size_t(r.external_index);
  switch (r.role) {
    case BufferRole::Input: name = src_.inputs.at(index).c_name; break;
    case BufferRole::Param:
      if (o_.params == ParamMode::Pointers) {
        name = src_.params.at(index).c_name;
      } else {
        name = baked_.at(index);
        static_array("param '" + r.name + "'", name, o_.param_values.find(r.name)->second);
      }
      break;
    case BufferRole::Constant:
      name = "rlx_c" + std::to_string(index);
      static_array("constant b" + std::to_string(r.id), name, m_.constant_values.at(index));
      break;
    case BufferRole::Arena: {
      if (int j = direct_[std::size_t(r.id)]; j >= 0) {
        name = src_.outputs[std::size_t(j)].c_name;
        break;
      }
      name = "rlx_b" + std::to_string(r.id);
      const std::string T(ctype(r.dtype));
      const std::string at = int_literal(r.arena_offset);
      if (o_.workspace == WorkspaceMode::Caller) {
        arena_.line(T + "* " + name + " = (" + T + "*)(rlx_ws + " + at + ");");
      } else {
        arena_types_.insert(pool_of(r.dtype));
        arena_.line(
            T + "* " + name + " = " +
            plus("rlx_arena." + pool_suffix(r.dtype), int_literal(r.arena_offset / i64(ir::dtype_size(r.dtype)))) +
            ";");
      }
      break;
    }
  }
  return name;
}

std::string Emitter::pointer(BufferId id) {
  const Buffer& b = m_.buffer(id);
  const Buffer& r = m_.buffer(b.root);
  if (b.dtype != r.dtype || b.view_offset % i64(ir::dtype_size(b.dtype)) != 0)
    throw Error("codegen::c: buffer b" + std::to_string(id) + " views b" + std::to_string(r.id) +
                " with another dtype or a misaligned offset");
  return plus(root_pointer(r), int_literal(b.view_offset / i64(ir::dtype_size(b.dtype))));
}

// "b3 arena @64 f32[4,8]", "b0 input 'x' f32[4,16]", "b5 f32[2,8]: view of b3 arena @64 at +32".
std::string Emitter::describe(BufferId id) const {
  const Buffer& b = m_.buffer(id);
  const Buffer& r = m_.buffer(b.root);
  std::string s = "b" + std::to_string(r.id) + " ";
  switch (r.role) {
    case BufferRole::Input: s += "input '" + r.name + "'"; break;
    case BufferRole::Param: s += "param '" + r.name + "'"; break;
    case BufferRole::Constant: s += "constant"; break;
    case BufferRole::Arena: {
      const int j = direct_[std::size_t(r.id)];
      s += j >= 0 ? "output '" + src_.outputs[std::size_t(j)].name + "'" : "arena @" + std::to_string(r.arena_offset);
      break;
    }
  }
  if (b.root == b.id) return s + " " + type_text(b.dtype, b.shape);
  return "b" + std::to_string(id) + " " + type_text(b.dtype, b.shape) + ": view of " + s + " at +" +
         std::to_string(b.view_offset);
}

std::string Emitter::kernel_body(const Kernel& k) {
  k_ = &k;
  g_ = &k.body;
  read_.assign(g_->size(), {});
  body_ = Code();
  // The anchor: the body's one node that is not an input, a constant or elementwise.
  const Node* anchor = nullptr;
  for (const Node& n : g_->nodes()) {
    if (n.op == OpKind::Input || n.op == OpKind::Constant || ir::is_elementwise(n.op)) continue;
    if (k.kind == KernelKind::MatMul && n.op == OpKind::Permute) continue;  // B read transposed: matmul() checks it
    if (anchor) fail(n, "is a second non-elementwise op in one kernel");
    anchor = &n;
  }
  auto need_anchor = [&]() -> const Node& {
    if (!anchor)
      throw Error("codegen::c: kernel '" + k.name + "' has no " + std::string(kernel_kind_name(k.kind)) + " op");
    return *anchor;
  };
  switch (k.kind) {
    case KernelKind::Elementwise:
      if (anchor) fail(*anchor, "is not elementwise");
      elementwise();
      break;
    case KernelKind::Reduce: reduce(need_anchor()); break;
    case KernelKind::MatMul: matmul(need_anchor()); break;
    case KernelKind::Movement: movement(need_anchor()); break;
    case KernelKind::Leaf: leaf_fill(need_anchor()); break;
    case KernelKind::Native:
      if (cuda_) {
        if (need_anchor().op == OpKind::Rope)
          rope(*anchor);
        else if (anchor->op == OpKind::DynamicUpdateSlice)
          dynamic_update_slice(*anchor);
        else
          row_op(*anchor);
        break;
      }
      [[fallthrough]];
    default:
      throw Error("codegen::c: kernel '" + k.name + "' is a " + std::string(kernel_kind_name(k.kind)) +
                  " kernel, which the C target cannot emit (composites must be decomposed and control flow unrolled: "
                  "compile for codegen::c::traits())");
  }
  return body_.str();
}

void Emitter::kernel(const Kernel& k, std::size_t index) {
  const std::string body = kernel_body(k);
  std::vector<std::string> params, args;
  std::string legend;
  for (std::size_t i = 0; i < k.inputs.size(); ++i) {
    params.push_back("const " + std::string(ctype(m_.buffer(k.inputs[i]).dtype)) + "* restrict in" + std::to_string(i));
    legend += "\n *   in" + std::to_string(i) + " = " + describe(k.inputs[i]);
    args.push_back(pointer(k.inputs[i]));
  }
  for (std::size_t j = 0; j < k.outputs.size(); ++j) {
    params.push_back(std::string(ctype(m_.buffer(k.outputs[j]).dtype)) + "* restrict out" + std::to_string(j));
    legend += "\n *   out" + std::to_string(j) + " = " + describe(k.outputs[j]);
    args.push_back(pointer(k.outputs[j]));
  }
  const std::string fn = "rlx_k" + std::to_string(index);
  kernels_.line("/* " + comment_text(k.name + legend) + " */");
  kernels_.open(param_list("static void " + fn, params));
  for (std::size_t i = 0; i < k.inputs.size(); ++i)  // a zero-size operand may be named by no loop
    if (!mentions(body, "in" + std::to_string(i))) kernels_.line("(void)in" + std::to_string(i) + ";");
  for (std::size_t j = 0; j < k.outputs.size(); ++j)
    if (!mentions(body, "out" + std::to_string(j))) kernels_.line("(void)out" + std::to_string(j) + ";");
  for (std::size_t at = 0; at < body.size();) {
    std::size_t end = body.find('\n', at);
    kernels_.line(body.substr(at, end - at));
    at = end + 1;
  }
  kernels_.close();
  kernels_.line("");
  std::string call = fn + "(";
  for (std::size_t i = 0; i < args.size(); ++i) call += (i ? ", " : "") + args[i];
  calls_.line(call + ");");
  src_.kernels.push_back(k.name);
}

// ---- kernel bodies ------------------------------------------------------------

std::string Emitter::value(NodeId id) const {
  const Node& n = g_->node(id);
  if (n.op == OpKind::Constant) {
    if (n.value->numel() != 1) fail(n, "is a constant of several elements inside a kernel body");
    return operand(element_literal(*n.value, 0));
  }
  if (read_[id].empty()) fail(n, "is read where the loop nest does not reach it");
  return read_[id];
}

// One scalar local per node, in body order: the fused chain at one element.
void Emitter::compute(const std::vector<NodeId>& nodes) {
  for (NodeId id : nodes) {
    const Node& n = g_->node(id);
    std::vector<std::string> a;
    for (auto x : n.inputs) a.push_back(value(x));
    read_[id] = "v" + std::to_string(id);
    body_.line(std::string(ctype(n.dtype)) + " " + read_[id] + " = " + expr(n, a) + ";");
  }
}

void Emitter::store_outputs(const std::string& off) {
  for (std::size_t j = 0; j < g_->outputs().size(); ++j)
    body_.line("out" + std::to_string(j) + "[" + off + "] = " + value(g_->outputs()[j].node) + ";");
}

std::string Emitter::ptr(NodeId id) const {
  const Node& n = g_->node(id);
  if (n.op == OpKind::Input) return n.attrs.get_str("name");
  for (std::size_t j = 0; j < g_->outputs().size(); ++j)
    if (g_->outputs()[j].node == id) return "out" + std::to_string(j);
  fail(n, "is neither a kernel input nor a kernel output");
}

// Unit dims vanish; a dim merges into the previous loop when every walk
// steps through the pair contiguously.
Merged merge_dims(const Ints& ext, const std::vector<Walk>& walks) {
  Merged m;
  Ints& e = m.e;
  std::vector<Ints>& s = m.s;
  s.resize(walks.size());
  for (std::size_t d = 0; d < ext.size(); ++d) {
    if (ext[d] == 1) continue;
    bool merge = !e.empty();
    for (std::size_t w = 0; merge && w < walks.size(); ++w) merge = s[w].back() == walks[w].strides[d] * ext[d];
    for (std::size_t w = 0; w < walks.size(); ++w) {
      if (merge)
        s[w].back() = walks[w].strides[d];
      else
        s[w].push_back(walks[w].strides[d]);
    }
    if (merge)
      e.back() *= ext[d];
    else
      e.push_back(ext[d]);
  }
  return m;
}

Nest Emitter::open_nest(const Ints& ext, const std::vector<Walk>& walks, char var) {
  const auto [e, s] = merge_dims(ext, walks);
  Nest nest;
  const bool phase = cuda_ && body_.depth() == 0, lane_loop = cuda_ && lane_loop_ && !phase;
  if (lane_loop) {
    // One loop over the nest's flattened index, the warp's lanes taking every 32nd iteration.
    lane_loop_ = false;
    const i64 total = numel(e);
    body_.open("for (int64_t rlx_r = rlx_lane; rlx_r < " + int_literal(total) + "; rlx_r += 32)");
    Ints inner(e.size(), 1);
    for (std::size_t k = e.size(); k-- > 1;) inner[k - 1] = inner[k] * e[k];
    for (std::size_t k = 0; k < e.size(); ++k) {
      std::string q = inner[k] == 1 ? "rlx_r" : "rlx_r / " + int_literal(inner[k]);
      if (k > 0) q += " % " + int_literal(e[k]);
      body_.line("const int64_t " + std::string(1, var) + std::to_string(k) + " = " + q + ";");
    }
    nest.depth = 1;
  } else if (phase) {
    // A phase: the nest's flattened index is spread over the grid, and each loop variable is recovered from it
    // (in 32 bits when the nest fits: 64-bit division by a constant costs several times more).
    const i64 lanes = lanes_ ? 32 : 1, total = numel(e), threads = total * lanes;
    lanes_ = false;
    body_.line(std::string(kPhaseMarker) + std::to_string(threads) + (serial_next_ ? " serial" : ""));
    serial_next_ = false;
    // Every lane of a warp runs the same iterations: the step is a multiple of the block, and so of 32.
    if (!phase_pragma_.empty()) body_.line(phase_pragma_);
    body_.open("for (int64_t rlx_t = rlx_first(); rlx_t < " + int_literal(threads) + "; rlx_t += rlx_step())");
    if (lanes > 1) body_.line("const int rlx_lane = (int)(rlx_t & 31);");
    const bool narrow = threads <= std::numeric_limits<std::int32_t>::max();
    auto lit = [&](i64 v) { return narrow ? std::to_string(v) + "u" : int_literal(v); };
    const std::string t =
        lanes > 1 ? (narrow ? "((uint32_t)rlx_t >> 5)" : "(rlx_t >> 5)") : (narrow ? "(uint32_t)rlx_t" : "rlx_t");
    Ints inner(e.size(), 1);  // the product of the extents after each dim
    for (std::size_t k = e.size(); k-- > 1;) inner[k - 1] = inner[k] * e[k];
    for (std::size_t k = 0; k < e.size(); ++k) {
      std::string q = inner[k] == 1 ? t : t + " / " + lit(inner[k]);
      if (k > 0) q += " % " + lit(e[k]);
      body_.line("const int64_t " + std::string(1, var) + std::to_string(k) + " = " +
                 (narrow ? "(int64_t)(" + q + ")" : q) + ";");
    }
    nest.depth = 1;
  } else {
    nest.depth = int(e.size());
  }
  for (std::size_t k = 0; k < e.size() && !phase && !lane_loop; ++k) {
    std::string v = var + std::to_string(k);
    body_.open("for (int64_t " + v + " = 0; " + v + " < " + int_literal(e[k]) + "; ++" + v + ")");
  }
  for (std::size_t w = 0; w < walks.size(); ++w) {
    std::string off = walks[w].base ? int_literal(walks[w].base) : "";
    for (std::size_t k = 0; k < e.size(); ++k) {
      i64 st = s[w][k];
      if (st == 0) continue;
      std::string term = var + std::to_string(k) + (std::abs(st) == 1 ? "" : " * " + int_literal(std::abs(st)));
      off += off.empty() ? (st < 0 ? "-" : "") + term : (st < 0 ? " - " : " + ") + term;
    }
    nest.off.push_back(off.empty() ? "0" : off);
  }
  return nest;
}

std::string Emitter::use(std::string_view helper, DType t) {
  const Helper* h =
      std::find_if(std::begin(kHelpers), std::end(kHelpers), [&](const Helper& x) { return x.name == helper; });
  std::string key(helper);
  if (h->per_float_type) key += "_" + pool_suffix(t);
  helpers_.insert(key);
  if (helper == "uniform01" || helper == "normal") helpers_.insert("mix");
  return "rlx_" + std::string(helper) + (h->per_float_type && t == DType::F32 ? "f" : "");
}

std::string Emitter::helpers() const {
  std::string out;
  for (const Helper& h : kHelpers) {
    for (DType t : {DType::F32, DType::F64}) {
      if (!helpers_.contains(h.per_float_type ? std::string(h.name) + "_" + pool_suffix(t) : std::string(h.name)))
        continue;
      std::string text(h.text);
      if (h.per_float_type) {
        text = replace_all(text, "$T", t == DType::F32 ? "float" : "double");
        text = replace_all(text, "$F", t == DType::F32 ? "f" : "");
      }
      out += text + "\n";
      if (!h.per_float_type) break;
    }
  }
  return out;
}

std::string Emitter::expr(const Node& n, const std::vector<std::string>& a) {
  const DType src = in(n, 0).dtype, t = n.dtype;
  const std::string T(ctype(t));
  const bool fl = ir::is_float(src), unsig = src == DType::U8;
  const std::string f = src == DType::F32 ? "f" : "";
  auto call = [&](const std::string& fn) { return fn + "(" + a[0] + ")"; };
  auto call2 = [&](const std::string& fn) { return fn + "(" + a[0] + ", " + a[1] + ")"; };
  auto wrap = [&](const std::string& op) {  // integer + - *: modular, never signed overflow
    return "(" + T + ")((uint64_t)" + a[0] + " " + op + " (uint64_t)" + a[1] + ")";
  };
  switch (n.op) {
    case OpKind::Neg: return fl ? "-" + a[0] : "(" + T + ")(0 - (uint64_t)" + a[0] + ")";
    case OpKind::Abs:
      if (fl) return call("fabs" + f);
      return unsig ? a[0] : "(" + T + ")(" + a[0] + " < 0 ? 0 - (uint64_t)" + a[0] + " : (uint64_t)" + a[0] + ")";
    case OpKind::Exp: return call("exp" + f);
    case OpKind::Log: return call("log" + f);
    case OpKind::Sqrt: return call("sqrt" + f);
    case OpKind::Rsqrt: return "1 / " + call("sqrt" + f);
    case OpKind::Reciprocal: return "1 / " + a[0];
    case OpKind::Tanh: return call("tanh" + f);
    case OpKind::Erf: return call("erf" + f);
    case OpKind::Sin: return call("sin" + f);
    case OpKind::Cos: return call("cos" + f);
    case OpKind::Relu:
      if (unsig) return a[0];
      return "(" + a[0] + " < 0 ? 0 : " + a[0] + ")";  // keeps NaN
    case OpKind::Floor: return fl ? call("floor" + f) : a[0];
    case OpKind::Ceil: return fl ? call("ceil" + f) : a[0];
    case OpKind::Round: return fl ? call("nearbyint" + f) : a[0];  // half to even in the default rounding mode
    case OpKind::Sign:
      if (fl) return call(use("sign", src));
      return unsig ? "(" + T + ")(" + a[0] + " > 0)" : "(" + T + ")((" + a[0] + " > 0) - (" + a[0] + " < 0))";
    case OpKind::Not: return "!" + a[0];
    case OpKind::Add: return fl ? a[0] + " + " + a[1] : wrap("+");
    case OpKind::Sub: return fl ? a[0] + " - " + a[1] : wrap("-");
    case OpKind::Mul: return fl ? a[0] + " * " + a[1] : wrap("*");
    case OpKind::Div: return fl ? a[0] + " / " + a[1] : "(" + T + ")" + call2(use("idiv"));
    case OpKind::Mod: return fl ? call2(use("mod", src)) : "(" + T + ")" + call2(use("imod"));
    case OpKind::Pow: return fl ? call2("pow" + f) : "(" + T + ")" + call2(use("ipow"));
    case OpKind::Max:
      return fl ? call2(use("max", src)) : "(" + a[0] + " > " + a[1] + " ? " + a[0] + " : " + a[1] + ")";
    case OpKind::Min:
      return fl ? call2(use("min", src)) : "(" + a[0] + " < " + a[1] + " ? " + a[0] + " : " + a[1] + ")";
    case OpKind::Eq: return a[0] + " == " + a[1];
    case OpKind::Ne: return a[0] + " != " + a[1];
    case OpKind::Lt: return a[0] + " < " + a[1];
    case OpKind::Le: return a[0] + " <= " + a[1];
    case OpKind::Gt: return a[0] + " > " + a[1];
    case OpKind::Ge: return a[0] + " >= " + a[1];
    case OpKind::And: return a[0] + " && " + a[1];
    case OpKind::Or: return a[0] + " || " + a[1];
    case OpKind::Where: return a[0] + " ? " + a[1] + " : " + a[2];
    case OpKind::Cast:
      if (t == DType::Bool) return a[0] + " != 0";
      if (ir::is_integer(t) && fl) return "(" + T + ")" + use("f2i") + "(" + a[0] + ")";
      return "(" + T + ")" + a[0];
    case OpKind::Clamp: {
      DType ct = src == DType::F32 ? DType::F32 : DType::F64;
      std::string lo = operand(float_literal(n.attrs.get_float("min"), ct)),
                  hi = operand(float_literal(n.attrs.get_float("max"), ct));
      std::string x = fl ? a[0] : "(double)" + a[0];
      std::string r = use("clamp", ct) + "(" + x + ", " + lo + ", " + hi + ")";
      return fl ? r : "(" + T + ")" + r;
    }
    default: fail(n, "is not elementwise");
  }
}

// The body nodes that are neither inputs nor constants, split at `anchor`
// (body order puts a reduce's prologue before it and the epilogue after it).
struct Split {
  std::vector<NodeId> before, after;
  std::set<NodeId> inputs_before, inputs_after;  // body inputs each side reads (the anchor counts as before)
};
Split split_at(const ir::Graph& g, NodeId anchor) {
  Split s;
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::Input || n.op == OpKind::Constant) continue;
    if (n.id != anchor) (n.id < anchor ? s.before : s.after).push_back(n.id);
    for (auto x : n.inputs)
      if (g.node(x).op == OpKind::Input) (n.id <= anchor ? s.inputs_before : s.inputs_after).insert(x);
  }
  return s;
}

// Every output has the iteration shape; every body input is read broadcast to it.
void Emitter::elementwise() {
  Ints e = extents(g_->node(g_->outputs().at(0).node));
  std::vector<Walk> walks{{ir::contiguous_strides(e), 0}};
  std::vector<NodeId> inputs, nodes;
  for (const Node& n : g_->nodes()) {
    if (n.op == OpKind::Input) {
      inputs.push_back(n.id);
      walks.push_back({broadcast_strides(extents(n), e), 0});
    } else if (n.op != OpKind::Constant) {
      nodes.push_back(n.id);
    }
  }
  if (cuda_) {
    std::vector<VecOperand> ops;
    for (std::size_t j = 0; j < g_->outputs().size(); ++j) {
      const BufferId b = k_->outputs.at(j);
      ops.push_back({"out" + std::to_string(j), m_.buffer(b).dtype, alignment_of(b), 0, g_->outputs()[j].node, true});
    }
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const Node& in_node = g_->node(inputs[i]);
      const BufferId b = k_->input_buffer(in_node);
      ops.push_back({ptr(inputs[i]), in_node.dtype, alignment_of(b), i + 1, inputs[i], false});
    }
    if (vector_phase(e, walks, ops, nodes)) return;
  }
  Nest nest = open_nest(e, walks, 'i');
  for (std::size_t i = 0; i < inputs.size(); ++i) read_[inputs[i]] = ptr(inputs[i]) + "[" + nest.off[i + 1] + "]";
  compute(nodes);
  store_outputs(nest.off[0]);
  body_.close(nest.depth);
}

// A reduction, or argmax/argmin, with its prologue computed per element read
// and its epilogue per element written. Loops run over the reduce input's
// rank: the outer nest over the kept dims, the inner one over the reduced.
void Emitter::reduce(const Node& a) {
  if (ir::op_info(a.op).cls != OpClass::Reduce) fail(a, "is not a reduction");
  const Node& x = in(a, 0);
  const Split s = split_at(*g_, a.id);
  const bool arg = a.op == OpKind::ArgMax || a.op == OpKind::ArgMin;
  Ints xe = extents(x), oe = extents(a);
  const std::size_t r = xe.size();
  std::vector<bool> reduced(r, false);
  std::size_t axis = 0;
  if (arg && r > 0) {
    axis = std::size_t(ir::normalize_axis(a.attrs.get_int("axis"), r));
    reduced[axis] = true;
  } else if (!arg) {
    for (auto ax : a.attrs.get_ints("axes")) reduced[std::size_t(ir::normalize_axis(ax, r))] = true;
  }
  Ints kept(r), over(r);  // extents of the outer and inner nests
  i64 count = 1;
  for (std::size_t d = 0; d < r; ++d) {
    kept[d] = reduced[d] ? 1 : xe[d];
    over[d] = reduced[d] ? xe[d] : 1;
    if (reduced[d]) count *= xe[d];
  }
  auto masked = [&](Ints st, bool keep_reduced) {
    for (std::size_t d = 0; d < r; ++d)
      if (reduced[d] != keep_reduced) st[d] = 0;
    return st;
  };
  // Strides over the reduce output, spread over the input's rank (no keepdims: the kept dims in order).
  auto spread = [&](const Ints& st) {
    if (st.size() == r) return st;
    Ints full(r, 0);
    for (std::size_t d = 0, j = 0; d < r; ++d)
      if (!reduced[d]) full[d] = st.at(j++);
    return full;
  };
  std::vector<Walk> walks{{ir::contiguous_strides(kept), 0}};
  std::vector<Ints> pro_strides;  // per prologue input, over the reduce input
  for (auto id : s.inputs_before) {
    pro_strides.push_back(broadcast_strides(extents(g_->node(id)), xe));
    walks.push_back({masked(pro_strides.back(), false), 0});
  }
  for (auto id : s.inputs_after) walks.push_back({spread(broadcast_strides(extents(g_->node(id)), oe)), 0});
  // On the GPU a long reduction gets a warp per output element: the lanes stride over the reduced elements and
  // combine their partial results with shuffles. (Argmax and argmin keep one thread: their ties go to the first.)
  const bool lanes = cuda_ && !arg && count >= 32 && body_.depth() == 0;
  lanes_ = lanes;
  Nest outer = open_nest(kept, walks, 'i');
  std::size_t w = 1;
  for (auto id : s.inputs_before) {
    const Node& n = g_->node(id);
    body_.line("const " + std::string(ctype(n.dtype)) + "* row" + ptr(id).substr(2) + " = " +
               plus(ptr(id), outer.off[w++]) + ";");
  }
  auto row = [&](NodeId id) { return "row" + ptr(id).substr(2); };

  const std::string T(ctype(a.dtype)), XT(ctype(x.dtype));
  const bool fl = ir::is_float(a.dtype);
  if (arg) {
    const std::string cmp = a.op == OpKind::ArgMax ? " > " : " < ";
    const i64 len = r > 0 ? xe[axis] : 1;
    body_.line("int64_t best = 0;");
    body_.line(XT + " best_val = 0;");
    body_.open("for (int64_t k = 0; k < " + int_literal(len) + "; ++k)");
    std::size_t p = 0;
    for (auto id : s.inputs_before) {
      const i64 st = r > 0 ? pro_strides[p][axis] : 0;
      read_[id] = row(id) + "[" + (st == 0 ? "0" : st == 1 ? "k" : "k * " + int_literal(st)) + "]";
      ++p;
    }
    compute(s.before);
    body_.line(XT + " val = " + value(x.id) + ";");
    // The first extreme wins; NaN counts as the extreme, as in NumPy.
    if (ir::is_float(x.dtype))
      body_.line("if (k == 0 || (!isnan(best_val) && (isnan(val) || val" + cmp +
                 "best_val))) best = k, best_val = val;");
    else
      body_.line("if (k == 0 || val" + cmp + "best_val) best = k, best_val = val;");
    body_.close();
    read_[a.id] = "v" + std::to_string(a.id);
    body_.line(T + " " + read_[a.id] + " = (" + T + ")best;");
  } else {
    const bool extreme = a.op == OpKind::ReduceMax || a.op == OpKind::ReduceMin, is_max = a.op == OpKind::ReduceMax;
    std::string acc_t = extreme ? T : fl ? "double" : "uint64_t", init = a.op == OpKind::ReduceProd ? "1" : "0";
    if (extreme) {
      static const std::map<DType, std::pair<std::string, std::string>> limits = {
          {DType::I8, {"INT8_MIN", "INT8_MAX"}},
          {DType::U8, {"0", "UINT8_MAX"}},
          {DType::I32, {"INT32_MIN", "INT32_MAX"}},
          {DType::I64, {"INT64_MIN", "INT64_MAX"}}};
      auto lim = limits.find(a.dtype);
      if (!fl && lim == limits.end()) fail(a, "has no C lowering for this dtype");
      init = fl ? (is_max ? "-INFINITY" : "INFINITY") : is_max ? lim->second.first : lim->second.second;
    }
    body_.line(acc_t + " acc = " + init + ";");
    std::vector<Walk> inner_walks;
    std::size_t p = 0;
    for (auto id : s.inputs_before) {
      (void)id;
      inner_walks.push_back({masked(pro_strides[p++], true), 0});
    }
    lane_loop_ = lanes;
    Nest inner = open_nest(over, inner_walks, 'r');
    p = 0;
    for (auto id : s.inputs_before) read_[id] = row(id) + "[" + inner.off[p++] + "]";
    compute(s.before);
    const std::string v = value(x.id);
    switch (a.op) {
      case OpKind::ReduceSum:
      case OpKind::ReduceMean: body_.line(fl ? "acc += " + v + ";" : "acc += (uint64_t)" + v + ";"); break;
      case OpKind::ReduceProd: body_.line(fl ? "acc *= " + v + ";" : "acc *= (uint64_t)" + v + ";"); break;
      case OpKind::ReduceMax:
      case OpKind::ReduceMin:
        body_.line(T + " val = " + v + ";");
        if (fl)  // NaN wins and then stays
          body_.line(std::string("if (!isnan(acc) && (isnan(val) || val ") + (is_max ? ">" : "<") +
                     " acc)) acc = val;");
        else
          body_.line(std::string("if (val ") + (is_max ? ">" : "<") + " acc) acc = val;");
        break;
      default: fail(a, "has no C lowering");
    }
    body_.close(inner.depth);
    if (lanes) {  // a butterfly: every lane ends with the whole result
      body_.open("for (int rlx_o = 16; rlx_o > 0; rlx_o >>= 1)");
      body_.line(acc_t + " other = (" + acc_t + ")rlx_shfl(acc, rlx_o);");
      switch (a.op) {
        case OpKind::ReduceProd: body_.line("acc *= other;"); break;
        case OpKind::ReduceMax:
        case OpKind::ReduceMin:
          if (fl)
            body_.line(std::string("if (!isnan(acc) && (isnan(other) || other ") + (is_max ? ">" : "<") +
                       " acc)) acc = other;");
          else
            body_.line(std::string("if (other ") + (is_max ? ">" : "<") + " acc) acc = other;");
          break;
        default: body_.line("acc += other;");
      }
      body_.close();
    }
    // The count as a float literal: over a zero-size axis acc / 0.0 is the NaN of a mean of nothing, where an
    // integer 0 would draw -Wdiv-by-zero.
    std::string result = a.op == OpKind::ReduceMean
                             ? "(" + T + ")(acc / " + float_literal(double(count), DType::F64) + ")"
                         : extreme ? "acc"
                                   : "(" + T + ")acc";
    read_[a.id] = "v" + std::to_string(a.id);
    body_.line(T + " " + read_[a.id] + " = " + result + ";");
  }
  for (auto id : s.inputs_after) read_[id] = ptr(id) + "[" + outer.off[w++] + "]";
  compute(s.after);
  if (lanes) body_.open("if (rlx_lane == 0)");
  store_outputs(outer.off[0]);
  if (lanes) body_.close();
  body_.close(outer.depth);
}

// A matmul (batch dims broadcast) and its epilogue, per output element.
void Emitter::matmul(const Node& n) {
  if (n.op != OpKind::MatMul) fail(n, "is not a matmul");
  // An operand is a kernel input, or one widened by a cast the lowering put in the kernel
  // (BackendTraits::matmul_widened_operands): it is read in its stored type.
  auto stored = [&](const Node& x) -> const Node& {
    return x.op == OpKind::Cast && in(x, 0).op == OpKind::Input ? in(x, 0) : x;
  };
  // B may be a permute swapping the last two dims of a kernel input (BackendTraits::matmul_transposed_b): the
  // input, [..., N, K], is read transposed.
  const Node* bp = &in(n, 1);
  const bool trans_b = bp->op == OpKind::Permute && ir::swaps_last_two(bp->attrs.get_ints("perm"));
  if (trans_b) bp = &in(*bp, 0);
  const Node &a = stored(in(n, 0)), &b = stored(*bp);
  if (a.op != OpKind::Input || b.op != OpKind::Input) fail(n, "has an operand that is not a kernel input");
  for (const Node& x : g_->nodes())
    if (x.op == OpKind::Permute && (!trans_b || x.id != in(n, 1).id)) fail(x, "is a permute that is not B's");
  const Split s = split_at(*g_, n.id);
  Ints oe = extents(n), ae = extents(a), be = extents(trans_b ? in(n, 1) : b);
  std::size_t r = oe.size();
  if (r < 2 || ae.size() < 2 || be.size() < 2) fail(n, "has an operand of rank below 2");
  product_is_output_ = s.after.empty() && g_->outputs().size() == 1 && g_->outputs()[0].node == n.id;
  if (product_input_) {  // the epilogue alone, over the product laid out as the matmul's row-major result
    std::vector<Walk> walks{{ir::contiguous_strides(oe), 0}};
    for (auto id : s.inputs_after) walks.push_back({broadcast_strides(extents(g_->node(id)), oe), 0});
    if (cuda_) {
      const i64 elem = i64(ir::dtype_size(n.dtype));
      std::vector<VecOperand> ops{{"rlx_prod", n.dtype,
                                   cuda_options_ ? std::max(cuda_options_->product_alignment, elem) : elem, 0, n.id,
                                   false}};
      for (std::size_t j = 0; j < g_->outputs().size(); ++j) {
        const BufferId b = k_->outputs.at(j);
        ops.push_back({"out" + std::to_string(j), m_.buffer(b).dtype, alignment_of(b), 0, g_->outputs()[j].node, true});
      }
      std::size_t w = 1;
      for (auto id : s.inputs_after)
        ops.push_back({ptr(id), g_->node(id).dtype, alignment_of(k_->input_buffer(g_->node(id))), w++, id, false});
      if (vector_phase(oe, walks, ops, s.after)) return;
    }
    Nest nest = open_nest(oe, walks, 'i');
    read_[n.id] = "v" + std::to_string(n.id);
    body_.line(std::string(ctype(n.dtype)) + " " + read_[n.id] + " = rlx_prod[" + nest.off[0] + "];");
    std::size_t w = 1;
    for (auto id : s.inputs_after) read_[id] = ptr(id) + "[" + nest.off[w++] + "]";
    compute(s.after);
    store_outputs(nest.off[0]);
    body_.close(nest.depth);
    return;
  }
  i64 m = oe[r - 2], cols = oe[r - 1], kdim = ae.back();
  // Batch dims broadcast; within a batch, a walks rows and b walks columns.
  Ints batch(oe.begin(), oe.end() - 2);
  Ints as = broadcast_strides(Ints(ae.begin(), ae.end() - 2), batch),
       bs = broadcast_strides(Ints(be.begin(), be.end() - 2), batch);
  for (auto& st : as) st *= m * kdim;
  for (auto& st : bs) st *= kdim * cols;
  as.insert(as.end(), {kdim, 0});
  bs.insert(bs.end(), {0, trans_b ? kdim : 1});
  std::vector<Walk> walks{{ir::contiguous_strides(oe), 0}, {as, 0}, {bs, 0}};
  for (auto id : s.inputs_after) walks.push_back({broadcast_strides(extents(g_->node(id)), oe), 0});
  Nest nest = open_nest(oe, walks, 'i');
  const std::string T(ctype(n.dtype));
  const bool fl = ir::is_float(n.dtype);
  body_.line("const " + std::string(ctype(a.dtype)) + "* ra = " + plus(ptr(a.id), nest.off[1]) + ";");
  body_.line("const " + std::string(ctype(b.dtype)) + "* rb = " + plus(ptr(b.id), nest.off[2]) + ";");
  body_.line(std::string(fl ? "double" : "uint64_t") + " acc = 0;");
  std::string bk = cols == 1 || trans_b ? "rb[k]" : "rb[k * " + int_literal(cols) + "]";
  body_.line("for (int64_t k = 0; k < " + int_literal(kdim) +
             "; ++k) acc += " + (fl ? "(double)ra[k] * " + bk : "(uint64_t)ra[k] * (uint64_t)" + bk) + ";");
  read_[n.id] = "v" + std::to_string(n.id);
  body_.line(T + " " + read_[n.id] + " = (" + T + ")acc;");
  std::size_t w = 3;
  for (auto id : s.inputs_after) read_[id] = ptr(id) + "[" + nest.off[w++] + "]";
  compute(s.after);
  store_outputs(nest.off[0]);
  body_.close(nest.depth);
}

void Emitter::movement(const Node& n) {
  const Node& x = in(n, 0);
  Ints oe = extents(n), xe = extents(x), xs = ir::contiguous_strides(xe);
  Walk out{ir::contiguous_strides(oe), 0};
  switch (n.op) {
    case OpKind::Reshape:
    case OpKind::Squeeze:
    case OpKind::Unsqueeze: copy(n, x.id, {numel(oe)}, {{1}, 0}, {{1}, 0}); break;
    case OpKind::Permute: {
      const auto& perm = n.attrs.get_ints("perm");
      Ints st;
      for (auto p : perm) st.push_back(xs[std::size_t(p)]);
      copy(n, x.id, oe, {st, 0}, out);
      break;
    }
    case OpKind::Expand: copy(n, x.id, oe, {broadcast_strides(xe, oe), 0}, out); break;
    case OpKind::Slice: {
      const auto &starts = n.attrs.get_ints("starts"), &steps = n.attrs.get_ints("steps");
      Walk from{xs, 0};
      for (std::size_t d = 0; d < xe.size(); ++d) {
        from.base += starts[d] * xs[d];
        from.strides[d] *= steps[d];
      }
      copy(n, x.id, oe, from, out);
      break;
    }
    case OpKind::Flip: {
      Walk from{xs, 0};
      for (auto ax : n.attrs.get_ints("axes")) {
        auto d = std::size_t(ir::normalize_axis(ax, xe.size()));
        if (xe[d] == 0) continue;
        from.base += (xe[d] - 1) * xs[d];
        from.strides[d] = -xs[d];
      }
      copy(n, x.id, oe, from, out);
      break;
    }
    case OpKind::Concat: concat(n); break;
    case OpKind::Pad: pad(n); break;
    case OpKind::Gather:
    case OpKind::IndexSelect:
    case OpKind::ScatterAdd: indexed(n); break;
    default: fail(n, "has no C lowering");
  }
}

void Emitter::copy(const Node& n, NodeId src, const Ints& ext, const Walk& from, const Walk& to) {
  Nest nest = open_nest(ext, {to, from}, 'i');
  body_.line(ptr(n.id) + "[" + nest.off[0] + "] = " + ptr(src) + "[" + nest.off[1] + "];");
  body_.close(nest.depth);
}

void Emitter::concat(const Node& n) {
  Ints oe = extents(n), os = ir::contiguous_strides(oe);
  auto axis = std::size_t(ir::normalize_axis(n.attrs.get_int("axis"), oe.size()));
  i64 at_axis = 0;
  for (std::size_t i = 0; i < n.inputs.size(); ++i) {
    Ints e = extents(in(n, i));
    body_.line("/* input " + std::to_string(i) + " at " + std::to_string(at_axis) + " along axis " +
               std::to_string(axis) + " */");
    copy(n, n.inputs[i], e, {ir::contiguous_strides(e), 0}, {os, at_axis * os[axis]});
    at_axis += e[axis];
  }
}

// Negative pads crop: only the overlap of input and output is copied.
void Emitter::pad(const Node& n) {
  const Node& x = in(n, 0);
  Ints oe = extents(n), xe = extents(x), os = ir::contiguous_strides(oe), xs = ir::contiguous_strides(xe);
  const auto& pads = n.attrs.get_ints("pads");
  std::size_t r = oe.size();
  Ints ext(r);
  i64 to = 0, from = 0;
  for (std::size_t d = 0; d < r; ++d) {
    i64 before = pads[d];
    ext[d] = std::max<i64>(0, std::min(oe[d], before + xe[d]) - std::max<i64>(0, before));
    to += std::max<i64>(0, before) * os[d];
    from += std::max<i64>(0, -before) * xs[d];
  }
  if (std::any_of(pads.begin(), pads.end(), [](i64 p) { return p > 0; })) {
    Nest fill = open_nest(oe, {{os, 0}}, 'i');
    body_.line(ptr(n.id) + "[" + fill.off[0] + "] = " + operand(literal(n.attrs.get_float("value"), n.dtype)) + ";");
    body_.close(fill.depth);
  }
  if (numel(ext) > 0) copy(n, x.id, ext, {xs, from}, {os, to});
}

// gather, index_select and scatter_add: one index read per element.
void Emitter::indexed(const Node& n) {
  const Node &x = in(n, 0), &idx = in(n, 1);
  Ints xe = extents(x), xs = ir::contiguous_strides(xe), ie = extents(idx);
  auto axis = std::size_t(ir::normalize_axis(n.attrs.get_int("axis"), xe.size()));
  std::string len = int_literal(xe[axis]), step = xs[axis] == 1 ? "" : " * " + int_literal(xs[axis]);
  auto index = [&](const std::string& off) {
    body_.line("int64_t k = " + use("index") + "((int64_t)" + ptr(idx.id) + "[" + off + "], " + len + ");");
  };
  const std::string out = ptr(n.id), src = ptr(x.id);
  switch (n.op) {
    case OpKind::Gather: {  // out[i] = x[i with i[axis] = idx[i]]
      Ints s = xs;
      s[axis] = 0;
      Nest nest = open_nest(ie, {{ir::contiguous_strides(ie), 0}, {ir::contiguous_strides(ie), 0}, {s, 0}}, 'i');
      index(nest.off[1]);
      body_.line(out + "[" + nest.off[0] + "] = " + src + "[" + plus(nest.off[2], "k" + step) + "];");
      body_.close(nest.depth);
      return;
    }
    case OpKind::IndexSelect: {  // out = x[:axis] + idx.shape + x[axis+1:]
      Ints oe = extents(n), s, is;
      Ints ics = ir::contiguous_strides(ie);
      for (std::size_t d = 0; d < axis; ++d) s.push_back(xs[d]), is.push_back(0);
      for (std::size_t d = 0; d < ie.size(); ++d) s.push_back(0), is.push_back(ics[d]);
      for (std::size_t d = axis + 1; d < xe.size(); ++d) s.push_back(xs[d]), is.push_back(0);
      Nest nest = open_nest(oe, {{ir::contiguous_strides(oe), 0}, {is, 0}, {s, 0}}, 'i');
      index(nest.off[1]);
      body_.line(out + "[" + nest.off[0] + "] = " + src + "[" + plus(nest.off[2], "k" + step) + "];");
      body_.close(nest.depth);
      return;
    }
    default: {  // scatter_add: out = x, then out[i with i[axis] = idx[i]] += upd[i]
      const Node& upd = in(n, 2);
      const std::string T(ctype(n.dtype));
      copy(n, x.id, xe, {xs, 0}, {xs, 0});
      Ints s = xs;
      s[axis] = 0;
      serial_next_ = true;  // indices may repeat: the sums run in order, as on the host
      Nest nest =
          open_nest(ie, {{ir::contiguous_strides(ie), 0}, {ir::contiguous_strides(extents(upd)), 0}, {s, 0}}, 'i');
      index(nest.off[0]);
      std::string dst = out + "[" + plus(nest.off[2], "k" + step) + "]", u = ptr(upd.id) + "[" + nest.off[1] + "]";
      body_.line(ir::is_float(n.dtype) ? dst + " += " + u + ";"
                                       : dst + " = (" + T + ")((uint64_t)" + dst + " + (uint64_t)" + u + ");");
      body_.close(nest.depth);
    }
  }
}

void Emitter::leaf_fill(const Node& n) {
  Ints e = extents(n);
  const std::string T(ctype(n.dtype)), out = ptr(n.id);
  std::string value;
  switch (n.op) {
    case OpKind::Iota: {
      if (e.empty()) {
        value = "0";
        break;
      }
      auto axis = std::size_t(ir::normalize_axis(n.attrs.get_int("axis"), e.size()));
      i64 stride = ir::contiguous_strides(e)[axis];
      std::string q = stride == 1 ? "i0" : "i0 / " + int_literal(stride);
      value =
          "(" + T + ")" + (stride * e[axis] == numel(e) ? "(" + q + ")" : "(" + q + " % " + int_literal(e[axis]) + ")");
      break;
    }
    case OpKind::RandomUniform: {
      double lo = n.attrs.get_float("low"), hi = n.attrs.get_float("high");
      value = "(" + T + ")(" + float_literal(lo, DType::F64) + " + " + operand(float_literal(hi - lo, DType::F64)) +
              " * (double)" + use("uniform01") + "(" + std::to_string(std::uint64_t(n.attrs.get_int("seed"))) +
              "ull, (uint64_t)i0))";
      break;
    }
    case OpKind::RandomNormal:
      value = "(" + T + ")(" + float_literal(n.attrs.get_float("mean"), DType::F64) + " + " +
              operand(float_literal(n.attrs.get_float("std"), DType::F64)) + " * " + use("normal") + "(" +
              std::to_string(std::uint64_t(n.attrs.get_int("seed"))) + "ull, (uint64_t)i0))";
      break;
    default: fail(n, "has no C lowering");
  }
  if (numel(e) == 1) {
    Nest one = open_nest({}, {}, 'i');
    body_.line(out + "[0] = " + replace_all(value, "i0", "0") + ";");
    body_.close(one.depth);
    return;
  }
  Nest nest = open_nest({numel(e)}, {{{1}, 0}}, 'i');
  body_.line(out + "[" + nest.off[0] + "] = " + value + ";");
  body_.close(nest.depth);
}

// ---- the function --------------------------------------------------------------

std::string Emitter::signature() const {
  std::vector<std::string> args;
  for (const auto& a : src_.inputs) args.push_back("const " + std::string(ctype(a.dtype)) + "* " + a.c_name);
  for (const auto& a : src_.params) args.push_back("const " + std::string(ctype(a.dtype)) + "* " + a.c_name);
  for (const auto& a : src_.outputs) args.push_back(std::string(ctype(a.dtype)) + "* " + a.c_name);
  if (o_.workspace == WorkspaceMode::Caller) args.push_back("void* workspace");
  return param_list("void " + src_.function_name, args);
}

Source Emitter::run() {
  arguments();
  root_.assign(m_.buffers.size(), {});
  for (std::size_t i = 0; i < m_.kernels.size(); ++i) kernel(m_.kernels[i], i);
  Code copies;
  for (std::size_t j = 0; j < m_.outputs.size(); ++j) {
    const Buffer& b = m_.buffer(m_.outputs[j]);
    const Arg& out = src_.outputs[j];
    if (direct_[std::size_t(b.root)] == int(j)) continue;
    if (b.nbytes() == 0) continue;
    copies.line("memcpy(" + out.c_name + ", " + pointer(b.id) + ", " + int_literal(b.nbytes()) + "); /* " +
                comment_text("output '" + out.name + "' is " + describe(b.id)) + " */");
  }
  src_.workspace_bytes = m_.memory.arena_bytes;
  src_.workspace = o_.workspace;

  std::string body;
  if (o_.workspace == WorkspaceMode::Caller && !arena_.str().empty())
    body += "unsigned char* rlx_ws = (unsigned char*)workspace;\n";
  body += arena_.str() + calls_.str() + copies.str();
  std::string unused;  // arguments no kernel names: an unread input, an empty output
  for (const auto* args : {&src_.inputs, &src_.params, &src_.outputs})
    for (const auto& a : *args)
      if (!mentions(body, a.c_name)) unused += "(void)" + a.c_name + ";\n";
  if (o_.workspace == WorkspaceMode::Caller && !mentions(body, "workspace")) unused += "(void)workspace;\n";
  body = unused + body;

  std::string fn = src_.function_name, upper;
  for (char ch : fn) upper += char(std::toupper(static_cast<unsigned char>(ch)));
  src_.header_file = fn + ".h";
  src_.source_file = fn + ".c";
  auto list = [](const std::vector<Arg>& args) {
    std::string s;
    for (const auto& a : args) s += (s.empty() ? "" : ", ") + a.c_name + " " + type_text(a.dtype, a.shape);
    return s.empty() ? std::string("none") : s;
  };
  std::string params = o_.params == ParamMode::Baked ? "baked into " + src_.source_file : list(src_.params);
  std::string ws = o_.workspace == WorkspaceMode::Caller
                       ? "caller-provided, " + upper + "_WORKSPACE_BYTES bytes, 16-byte aligned (reentrant)"
                       : std::to_string(src_.workspace_bytes) + " bytes (the LIR's arena), static in " +
                             src_.source_file + " (not reentrant)";
  std::string h = "/* " + src_.header_file + ": generated by rlx::codegen::c from graph '" + comment_text(m_.name) +
                  "'. Do not edit.\n *\n * Inputs:    " + list(src_.inputs) + "\n * Params:    " + params +
                  "\n * Outputs:   " + list(src_.outputs) + "\n * Workspace: " + ws +
                  "\n * Buffers are row-major and must not overlap. */\n#ifndef RLX_GEN_" + upper +
                  "_H\n#define RLX_GEN_" + upper +
                  "_H\n\n#include <stdint.h>\n\n#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n";
  if (o_.workspace == WorkspaceMode::Caller)
    h += "#define " + upper + "_WORKSPACE_BYTES " + std::to_string(src_.workspace_bytes) + "\n\n";
  h += signature() + ";\n\n#ifdef __cplusplus\n}\n#endif\n\n#endif\n";
  src_.header = std::move(h);

  std::string c = "/* " + src_.source_file + ": generated by rlx::codegen::c from graph '" + comment_text(m_.name) +
                  "'. Do not edit.\n * The " + std::to_string(m_.kernels.size()) +
                  " kernels of its LIR, one function each, run in order over its memory plan (arena " +
                  std::to_string(m_.memory.arena_bytes) + " bytes).\n" +
                  " * Needs only the C99 standard library; link with -lm. */\n#include \"" + src_.header_file +
                  "\"\n\n#include <math.h>\n#include <stdint.h>\n#include <string.h>\n\n";
  if (std::string hs = helpers(); !hs.empty()) c += hs + "\n";
  if (!arena_types_.empty()) {
    // Each byte holds one dtype only (plan_memory without reuse across dtypes), read through its own member.
    // C has no empty arrays: an arena of zero-size buffers still gets one element.
    c += "/* The arena, laid out by the LIR's memory plan: one member per C type it holds. */\nstatic union {\n";
    for (DType t : arena_types_) {
      const i64 size = i64(ir::dtype_size(t));
      c += "  " + std::string(ctype(t)) + " " + pool_suffix(t) + "[" +
           std::to_string(std::max<i64>((m_.memory.arena_bytes + size - 1) / size, 1)) + "];\n";
    }
    c += "} rlx_arena;\n\n";
  }
  if (!statics_.str().empty()) c += statics_.str() + "\n";
  c += kernels_.str();
  c += signature() + " {\n";
  for (std::size_t at = 0; at < body.size();) {  // indent the body one level
    std::size_t end = body.find('\n', at);
    if (end > at) c += "  ";
    c += body.substr(at, end - at + 1);
    at = end + 1;
  }
  c += "}\n";
  src_.source = std::move(c);
  return std::move(src_);
}

// The CUDA dialect: alignment_of, vector_phase and cuda().
#include "codegen/c_cuda.inc"

// The C function name for `name`; throws for an explicit one C cannot use.
std::string function_name(const std::string& requested, const std::string& graph_name) {
  if (requested.empty()) {
    std::set<std::string, std::less<>> none;
    std::string fn = identifier(graph_name, none);
    while (is_libc_name(fn)) fn += '_';
    return fn;
  }
  if (!std::all_of(requested.begin(), requested.end(),
                   [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; }) ||
      std::isdigit(static_cast<unsigned char>(requested[0])) || reserved_names().contains(requested) ||
      is_libc_name(requested) || is_local_name(requested))
    throw Error("codegen::c: function name '" + requested +
                "' is not usable as the C function name: it must be an identifier that is no C keyword, "
                "C library function or name the generated code reserves (rlx_*, ws_*, v<n>, i<n>, r<n>)");
  return requested;
}

}  // namespace

std::string_view c_type(DType t) {
  switch (t) {
    case DType::F32: return "float";
    case DType::F64: return "double";
    case DType::I8: return "int8_t";
    case DType::U8:
    case DType::Bool: return "uint8_t";
    case DType::I32: return "int32_t";
    case DType::I64: return "int64_t";
    default: throw Error("codegen::c: dtype " + std::string(ir::dtype_name(t)) + " has no C type (cast to f32 first)");
  }
}

compile::BackendTraits traits() {
  compile::BackendTraits t;
  t.name = "c";
  // Every primitive; composites and formula ops run as their decompositions, control flow only unrolled.
  for (OpKind op : ir::kAllOps) {
    auto cls = ir::op_info(op).cls;
    if (cls != OpClass::Composite && cls != OpClass::Custom && cls != OpClass::ControlFlow &&
        !ir::op_def(op).has_decomposition())
      t.native_ops.insert(op);
  }
  t.native_dtypes = {DType::F32, DType::F64, DType::I8, DType::U8, DType::I32, DType::I64, DType::Bool};
  t.arena_alignment = 16;
  t.arena_reuse_across_dtypes = false;
  return t;
}

Source emit(const compile::LirModule& lir, const Options& options) {
  if (lir.outputs.empty()) throw Error("codegen::c: graph '" + lir.name + "' has no outputs");
  const auto native = traits().native_dtypes;
  for (const Buffer& b : lir.buffers)
    if (!native.contains(b.dtype))
      throw Error("codegen::c: buffer b" + std::to_string(b.id) + " '" + b.name + "': dtype " +
                  std::string(ir::dtype_name(b.dtype)) +
                  " is not supported by the C target (f32, f64, i8, u8, i32, i64 and bool are)");
  return Emitter(lir, options, function_name(options.function_name, lir.name)).run();
}

Source emit(const ir::Graph& g, const Options& options) {
  if (g.outputs().empty()) throw Error("codegen::c: graph '" + g.name() + "' has no outputs");
  const auto native = traits().native_dtypes;
  for (const Node& n : g.nodes()) {
    if (!native.contains(n.dtype))
      throw Error("codegen::c: " + ir::describe_node(g, n) + ": dtype " + std::string(ir::dtype_name(n.dtype)) +
                  " is not supported by the C target (f32, f64, i8, u8, i32, i64 and bool are)");
    if (!n.shape.is_static())
      throw Error("codegen::c: " + ir::describe_node(g, n) + ": shape " + n.shape.str() +
                  " is symbolic; bind it first (ir::bind_symbols)");
  }
  (void)function_name(options.function_name, g.name());  // a bad name fails before compiling
  compile::LirModule lir;
  try {
    lir = std::move(compile::compile(g, traits(), {}).lir);
  } catch (const Error& e) {
    throw Error("codegen::c: " + std::string(e.what()));
  }
  return emit(lir, options);
}

CudaModule emit_cuda(const compile::LirModule& lir, const CudaOptions& options) {
  static const Options kNone;
  return Emitter(lir, kNone, "rlx").cuda(options);
}

std::string CudaModule::program(const std::vector<std::string>& entries) const {
  std::string out = prelude;
  for (const auto& k : kernels)
    for (const auto* phases : {&k.phases, &k.epilogue})
      for (const auto& ph : *phases)
        if (std::find(entries.begin(), entries.end(), ph.entry) != entries.end()) out += ph.text;
  return out;
}

void write(const Source& source, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  for (const auto& [name, text] :
       {std::pair{source.header_file, &source.header}, {source.source_file, &source.source}}) {
    std::ofstream f(dir / name, std::ios::binary);
    f << *text;
    if (!f) throw Error("codegen::c: cannot write " + (dir / name).string());
  }
}

}  // namespace rlx::codegen::c
