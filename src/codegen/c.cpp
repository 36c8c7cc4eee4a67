// The C target. The emitted function is the decomposed graph in order, one
// block per node; every loop nest walks row-major buffers with strides baked
// in as constants, so the code needs no shape metadata at run time.
//
// Storage: inputs and params are the caller's pointers (or baked arrays),
// reshapes are views of their source, the first output naming a node is
// computed straight into the caller's output buffer, and the rest lives in
// the workspace. The workspace holds one pool per C type, and a slot is only
// ever reused by a buffer of the same type, so no memory changes its
// effective type and the code stays within C's aliasing rules at -O2.
#include "rlx/codegen/c.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <set>

#include "rlx/compile/pipeline.hpp"
#include "rlx/error.hpp"

namespace rlx::codegen::c {
namespace {

using ir::DType;
using ir::Node;
using ir::NodeId;
using ir::OpClass;
using ir::OpKind;
using i64 = std::int64_t;
using Ints = std::vector<i64>;

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

std::string attr_text(const ir::Attrs& attrs) {
  std::string s;
  for (const auto& [key, value] : attrs.items()) {
    s += s.empty() ? "{" : ", ";
    s += key + "=";
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::int64_t>)
            s += std::to_string(v);
          else if constexpr (std::is_same_v<V, double>)
            s += float_literal(v, DType::F64);
          else if constexpr (std::is_same_v<V, bool>)
            s += v ? "true" : "false";
          else if constexpr (std::is_same_v<V, std::string>)
            s += v;
          else if constexpr (std::is_same_v<V, DType>)
            s += ir::dtype_name(v);
          else if constexpr (std::is_same_v<V, ir::GraphRef>)
            s += "graph " + v->name();
          else {
            s += "[";
            for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
            s += "]";
          }
        },
        value);
  }
  return s.empty() ? s : s + "}";
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
  Ints s(out.size(), 0), cs = ir::contiguous_strides(in);
  std::size_t lead = out.size() - in.size();
  for (std::size_t i = 0; i < in.size(); ++i)
    if (in[i] != 1) s[lead + i] = cs[i];
  return s;
}

// ---- helpers the emitted code may call -------------------------------------
// $T is the C float type and $F the math suffix ("f" for float); each float
// helper exists once per float dtype used. Listed in dependency order.
struct Helper {
  std::string_view name;
  bool per_float_type;
  std::string_view text;
};
constexpr Helper kHelpers[] = {
    {"sign", true, "static $T rlx_sign$F($T x) { return isnan(x) ? x : ($T)((x > 0) - (x < 0)); }"},
    {"max", true, "static $T rlx_max$F($T a, $T b) { return isnan(a) || isnan(b) ? ($T)NAN : fmax$F(a, b); }"},
    {"min", true, "static $T rlx_min$F($T a, $T b) { return isnan(a) || isnan(b) ? ($T)NAN : fmin$F(a, b); }"},
    {"mod", true,
     "/* Python's modulo: the result takes the divisor's sign. */\n"
     "static $T rlx_mod$F($T a, $T b) {\n"
     "  $T r = fmod$F(a, b);\n"
     "  if (r == 0) return copysign$F(0, b);\n"
     "  return (r < 0) != (b < 0) ? r + b : r;\n}"},
    {"clamp", true,
     "static $T rlx_clamp$F($T x, $T lo, $T hi) { return isnan(x) || isnan(lo) || isnan(hi) ? x + lo + hi : "
     "fmin$F(fmax$F(x, lo), hi); }"},
    {"idiv", false,
     "/* Truncating division; x / 0 is 0 and INT64_MIN / -1 wraps, as in RLX. */\n"
     "static int64_t rlx_idiv(int64_t x, int64_t y) {\n"
     "  if (y == 0) return 0;\n"
     "  return y == -1 ? (int64_t)(0 - (uint64_t)x) : x / y;\n}"},
    {"imod", false,
     "static int64_t rlx_imod(int64_t x, int64_t y) {\n"
     "  int64_t r;\n"
     "  if (y == 0 || y == -1) return 0;\n"
     "  r = x % y;\n"
     "  return r != 0 && (r < 0) != (y < 0) ? r + y : r;\n}"},
    {"ipow", false,
     "static int64_t rlx_ipow(int64_t base, int64_t e) {\n"
     "  uint64_t r = 1, b = (uint64_t)base;\n"
     "  if (e < 0) return base == 1 ? 1 : base == -1 ? (e % 2 ? -1 : 1) : 0;\n"
     "  for (; e; e >>= 1, b *= b)\n"
     "    if (e & 1) r *= b;\n"
     "  return (int64_t)r;\n}"},
    {"f2i", false,
     "/* Float to integer as RLX stores it: NaN is 0, truncation, two's complement wrap. */\n"
     "static int64_t rlx_f2i(double v) {\n"
     "  double t;\n"
     "  if (isnan(v)) return 0;\n"
     "  t = fmod(trunc(v), 18446744073709551616.0);\n"
     "  if (t >= 9223372036854775808.0) t -= 18446744073709551616.0;\n"
     "  else if (t < -9223372036854775808.0) t += 18446744073709551616.0;\n"
     "  return (int64_t)t;\n}"},
    {"index", false,
     "/* An index wrapped once Python-style, then clamped into [0, n). */\n"
     "static int64_t rlx_index(int64_t i, int64_t n) {\n"
     "  if (i < 0) i += n;\n"
     "  return i < 0 ? 0 : i >= n ? n - 1 : i;\n}"},
    {"mix", false,
     "/* The counter-based RNG of rlx/ir/random.hpp, bit for bit. */\n"
     "static uint64_t rlx_mix(uint64_t seed, uint64_t index) {\n"
     "  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull;\n"
     "  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;\n"
     "  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;\n"
     "  return z ^ (z >> 31);\n}"},
    {"uniform01", false,
     "static float rlx_uniform01(uint64_t seed, uint64_t index) {\n"
     "  return (float)(rlx_mix(seed, index) >> 40) * (1.0f / 16777216.0f);\n}"},
    {"normal", false,
     "static double rlx_normal(uint64_t seed, uint64_t index) {\n"
     "  double u1 = ((double)(rlx_mix(seed, 2 * index) >> 40) + 1.0) * (1.0 / 16777216.0);\n"
     "  double u2 = (double)(rlx_mix(seed, 2 * index + 1) >> 40) * (1.0 / 16777216.0);\n"
     "  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);\n}"},
};

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

struct Slot {
  DType pool;
  i64 offset = 0;  // in elements
};

class Emitter {
 public:
  Emitter(const ir::Graph& g, const Options& o, std::string fn) : g_(g), o_(o) { src_.function_name = std::move(fn); }
  Source run();

 private:
  void liveness();
  void arguments();
  void storage();
  void static_array(const std::string& what, const std::string& name, const ir::Tensor& t);
  void emit_node(const Node& n);
  void elementwise(const Node& n);
  std::string expr(const Node& n, const std::vector<std::string>& a);
  void reduce(const Node& n);
  void arg_reduce(const Node& n);
  void matmul(const Node& n);
  void copy(const Node& n, NodeId src, const Ints& ext, const Walk& from, const Walk& to);
  void concat(const Node& n);
  void pad(const Node& n);
  void indexed(const Node& n);
  void leaf_fill(const Node& n);
  std::string signature() const;
  std::string helpers() const;

  Nest open_nest(const Ints& ext, const std::vector<Walk>& walks, char var);
  std::string use(std::string_view helper, DType t = DType::F64);
  std::string at(NodeId id, const std::string& off) const {
    return lit_[id].empty() ? var_[id] + "[" + off + "]" : operand(lit_[id]);
  }
  const Node& in(const Node& n, std::size_t i) const { return g_.node(n.inputs[i]); }
  [[noreturn]] void fail(const Node& n, const std::string& why) const {
    throw Error("codegen::c: " + ir::describe_node(g_, n) + ": " + why);
  }

  const ir::Graph& g_;
  const Options& o_;
  Source src_;
  std::vector<bool> needed_;
  std::vector<std::size_t> last_use_;  // per storage root; g_.size() for outputs
  std::vector<NodeId> root_;
  std::vector<std::string> var_, lit_;
  std::vector<bool> direct_;  // per output: computed straight into its argument
  std::vector<std::string> unused_args_;
  std::map<DType, i64> pools_, pool_at_;  // elements per pool; its byte offset in a caller workspace
  std::vector<std::optional<Slot>> slot_;
  std::set<std::string> helpers_;
  Code statics_, body_;
};

bool is_view(OpKind op) { return op == OpKind::Reshape || op == OpKind::Squeeze || op == OpKind::Unsqueeze; }
bool is_external(OpKind op) { return op == OpKind::Input || op == OpKind::Param || op == OpKind::Constant; }
Ints extents(const Node& n) { return n.shape.extents(); }

// "a + b" without "+ 0" noise; for a pointer plus an offset or two offsets.
std::string plus(const std::string& a, const std::string& b) { return b == "0" ? a : a == "0" ? b : a + " + " + b; }

void Emitter::liveness() {
  std::size_t n = g_.size();
  needed_.assign(n, false);
  last_use_.assign(n, 0);
  root_.resize(n);
  for (const auto& o : g_.outputs()) needed_[o.node] = true;
  for (std::size_t i = n; i-- > 0;)
    if (needed_[i])
      for (auto id : g_.nodes()[i].inputs) needed_[id] = true;
  for (const Node& node : g_.nodes()) {
    root_[node.id] = is_view(node.op) ? root_[node.inputs[0]] : node.id;
    if (!needed_[node.id]) continue;
    for (auto id : node.inputs) last_use_[root_[id]] = std::max<std::size_t>(last_use_[root_[id]], node.id);
  }
  for (const auto& o : g_.outputs()) last_use_[root_[o.node]] = n;
}

void Emitter::arguments() {
  std::set<std::string, std::less<>> taken;
  var_.assign(g_.size(), {});
  auto arg = [&](const Node& n, const std::string& name) {
    return Arg{name, identifier(name, taken), n.dtype, extents(n)};
  };
  for (auto id : g_.input_ids()) {
    const Node& n = g_.node(id);
    src_.inputs.push_back(arg(n, n.attrs.get_str("name")));
    var_[id] = src_.inputs.back().c_name;
    if (!needed_[id]) unused_args_.push_back(var_[id]);
  }
  std::set<std::string, std::less<>> baked, baked_names;
  for (auto id : g_.param_ids()) {
    const Node& n = g_.node(id);
    const std::string& name = n.attrs.get_str("name");
    if (o_.params == ParamMode::Pointers) {
      src_.params.push_back(arg(n, name));
      var_[id] = src_.params.back().c_name;
      if (!needed_[id]) unused_args_.push_back(var_[id]);
      continue;
    }
    baked.insert(name);
    if (!needed_[id]) continue;
    auto it = o_.param_values.find(name);
    if (it == o_.param_values.end())
      throw Error("codegen::c: param '" + name +
                  "' has no value; ParamMode::Baked needs every param in Options::param_values");
    const ir::Tensor& t = it->second;
    if (t.dtype() != n.dtype || t.shape() != extents(n))
      throw Error("codegen::c: param '" + name + "' is " + type_text(n.dtype, extents(n)) + " but its baked value is " +
                  type_text(t.dtype(), t.shape()));
    var_[id] = "rlx_p_" + identifier(name, baked_names);
  }
  for (const auto& [name, t] : o_.param_values)
    if (o_.params == ParamMode::Baked && !baked.contains(name))
      throw Error("codegen::c: Options::param_values names '" + name + "', which is not a param of graph '" +
                  g_.name() + "'");
  for (std::size_t j = 0; j < g_.outputs().size(); ++j) {
    const auto& o = g_.outputs()[j];
    src_.outputs.push_back(arg(g_.node(o.node), o.name.empty() ? "out" + std::to_string(j) : o.name));
  }
}

void Emitter::static_array(const std::string& what, const std::string& name, const ir::Tensor& t) {
  std::string init;
  for (i64 i = 0; i < t.numel(); ++i) init += (i ? (i % 8 ? ", " : ",\n    ") : "") + element_literal(t, i);
  statics_.line("/* " + what + " " + type_text(t.dtype(), t.shape()) + " */");
  // C has no empty arrays: an empty tensor still gets one (unread) element.
  statics_.line("static const " + std::string(c_type(t.dtype())) + " " + name + "[" +
                std::to_string(std::max<i64>(t.numel(), 1)) + "] = {\n    " + (init.empty() ? "0" : init) + "};");
}

void Emitter::storage() {
  lit_.assign(g_.size(), {});
  slot_.assign(g_.size(), std::nullopt);
  // A one-element constant read only by elementwise ops becomes a literal.
  std::vector<bool> array_use(g_.size(), false);
  for (const Node& n : g_.nodes())
    if (needed_[n.id] && !ir::is_elementwise(n.op))
      for (auto id : n.inputs) array_use[id] = true;
  for (const auto& o : g_.outputs()) array_use[o.node] = true;
  std::vector<bool> owns_output(g_.size(), false);
  direct_.assign(g_.outputs().size(), false);
  for (std::size_t j = 0; j < g_.outputs().size(); ++j) {
    NodeId id = g_.outputs()[j].node;
    const Node& n = g_.node(id);
    if (is_external(n.op) || is_view(n.op) || owns_output[id]) continue;
    owns_output[id] = direct_[j] = true;
    var_[id] = src_.outputs[j].c_name;
  }

  struct Live {
    i64 offset, size;
    std::size_t end;
  };
  std::map<DType, std::vector<Live>> live;
  for (const Node& n : g_.nodes()) {
    if (!needed_[n.id]) continue;
    if (n.op == OpKind::Constant) {
      const ir::Tensor& t = *n.value;
      if (t.numel() == 1 && !array_use[n.id]) {
        lit_[n.id] = element_literal(t, 0);
        continue;
      }
      var_[n.id] = "rlx_c" + std::to_string(n.id);
      static_array("%" + std::to_string(n.id) + " constant", var_[n.id], t);
      continue;
    }
    if (n.op == OpKind::Param && o_.params == ParamMode::Baked) {
      const std::string& name = n.attrs.get_str("name");
      static_array("param '" + name + "'", var_[n.id], o_.param_values.find(name)->second);
      continue;
    }
    if (is_external(n.op)) continue;
    if (is_view(n.op)) {
      var_[n.id] = var_[n.inputs[0]];
      lit_[n.id] = lit_[n.inputs[0]];
      continue;
    }
    if (owns_output[n.id]) continue;
    // Best fit among the gaps between live slots of this pool; a slot frees
    // after the node that reads it last, so inputs never overlap outputs.
    DType pool = pool_of(n.dtype);
    auto& slots = live[pool];
    std::erase_if(slots, [&](const Live& l) { return l.end < n.id; });
    std::sort(slots.begin(), slots.end(), [](const Live& a, const Live& b) { return a.offset < b.offset; });
    i64 size = std::max<i64>(n.shape.numel(), 1), best = -1, best_gap = 0, cursor = 0;
    for (const Live& l : slots) {
      i64 gap = l.offset - cursor;
      if (gap >= size && (best < 0 || gap < best_gap)) best = cursor, best_gap = gap;
      cursor = std::max(cursor, l.offset + l.size);
    }
    if (best < 0) best = cursor;
    slots.push_back({best, size, last_use_[n.id]});
    pools_[pool] = std::max(pools_[pool], best + size);
    slot_[n.id] = Slot{pool, best};
    var_[n.id] = "v" + std::to_string(n.id);
  }
  i64 bytes = 0;
  for (const auto& [pool, elems] : pools_) {
    pool_at_[pool] = bytes = (bytes + 15) / 16 * 16;
    bytes += elems * i64(ir::dtype_size(pool));
  }
  src_.workspace_bytes = bytes;
  src_.workspace = o_.workspace;
}

Nest Emitter::open_nest(const Ints& ext, const std::vector<Walk>& walks, char var) {
  // Unit dims vanish; a dim merges into the previous loop when every walk
  // steps through the pair contiguously.
  Ints e;
  std::vector<Ints> s(walks.size());
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
  Nest nest;
  nest.depth = int(e.size());
  for (std::size_t k = 0; k < e.size(); ++k) {
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
  const std::string T(c_type(t));
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

void Emitter::elementwise(const Node& n) {
  Ints e = extents(n);
  std::vector<Walk> walks{{ir::contiguous_strides(e), 0}};
  std::vector<int> walk_of(n.inputs.size(), -1);
  for (std::size_t i = 0; i < n.inputs.size(); ++i) {
    if (!lit_[n.inputs[i]].empty()) continue;
    walk_of[i] = int(walks.size());
    walks.push_back({broadcast_strides(extents(in(n, i)), e), 0});
  }
  Nest nest = open_nest(e, walks, 'i');
  std::vector<std::string> a;
  for (std::size_t i = 0; i < n.inputs.size(); ++i)
    a.push_back(at(n.inputs[i], walk_of[i] < 0 ? "0" : nest.off[std::size_t(walk_of[i])]));
  body_.line(var_[n.id] + "[" + nest.off[0] + "] = " + expr(n, a) + ";");
  body_.close(nest.depth);
}

void Emitter::reduce(const Node& n) {
  const Node& x = in(n, 0);
  Ints xe = extents(x), xs = ir::contiguous_strides(xe), ke, ks, re, rs;
  std::vector<bool> reduced(xe.size(), false);
  for (auto a : n.attrs.get_ints("axes")) reduced[std::size_t(ir::normalize_axis(a, xe.size()))] = true;
  for (std::size_t d = 0; d < xe.size(); ++d) {
    (reduced[d] ? re : ke).push_back(xe[d]);
    (reduced[d] ? rs : ks).push_back(xs[d]);
  }
  const std::string T(c_type(n.dtype));
  const bool fl = ir::is_float(n.dtype), extreme = n.op == OpKind::ReduceMax || n.op == OpKind::ReduceMin;
  const bool is_max = n.op == OpKind::ReduceMax;
  std::string acc_t = extreme ? T : fl ? "double" : "uint64_t", init = n.op == OpKind::ReduceProd ? "1" : "0";
  if (extreme) {
    static const std::map<DType, std::pair<std::string, std::string>> limits = {
        {DType::I8, {"INT8_MIN", "INT8_MAX"}},
        {DType::U8, {"0", "UINT8_MAX"}},
        {DType::I32, {"INT32_MIN", "INT32_MAX"}},
        {DType::I64, {"INT64_MIN", "INT64_MAX"}}};
    init = fl ? (is_max ? "-INFINITY" : "INFINITY") : is_max ? limits.at(n.dtype).first : limits.at(n.dtype).second;
  }
  Nest outer = open_nest(ke, {{ir::contiguous_strides(ke), 0}, {ks, 0}}, 'i');
  body_.line("const " + T + "* row = " + plus(var_[x.id], outer.off[1]) + ";");
  body_.line(acc_t + " acc = " + init + ";");
  Nest inner = open_nest(re, {{rs, 0}}, 'r');
  std::string v = "row[" + inner.off[0] + "]";
  switch (n.op) {
    case OpKind::ReduceSum:
    case OpKind::ReduceMean: body_.line(fl ? "acc += " + v + ";" : "acc += (uint64_t)" + v + ";"); break;
    case OpKind::ReduceProd: body_.line(fl ? "acc *= " + v + ";" : "acc *= (uint64_t)" + v + ";"); break;
    default:
      body_.line(T + " val = " + v + ";");
      if (fl)  // NaN wins and then stays
        body_.line(std::string("if (!isnan(acc) && (isnan(val) || val ") + (is_max ? ">" : "<") + " acc)) acc = val;");
      else
        body_.line(std::string("if (val ") + (is_max ? ">" : "<") + " acc) acc = val;");
  }
  body_.close(inner.depth);
  // The count as a float literal: over a zero-size axis acc / 0.0 is the NaN of a mean of nothing, where an
  // integer 0 would draw -Wdiv-by-zero.
  std::string result = n.op == OpKind::ReduceMean
                           ? "(" + T + ")(acc / " + float_literal(double(numel(re)), DType::F64) + ")"
                       : extreme ? "acc"
                                 : "(" + T + ")acc";
  body_.line(var_[n.id] + "[" + outer.off[0] + "] = " + result + ";");
  body_.close(outer.depth);
}

// The first extreme wins; NaN counts as the extreme, as in NumPy.
void Emitter::arg_reduce(const Node& n) {
  const Node& x = in(n, 0);
  Ints xe = extents(x), xs = ir::contiguous_strides(xe);
  if (xe.empty()) {
    body_.line(var_[n.id] + "[0] = 0;");
    return;
  }
  auto axis = std::size_t(ir::normalize_axis(n.attrs.get_int("axis"), xe.size()));
  i64 len = xe[axis], step = xs[axis];
  Ints ke = xe, ks = xs;
  ke.erase(ke.begin() + std::ptrdiff_t(axis));
  ks.erase(ks.begin() + std::ptrdiff_t(axis));
  const std::string T(c_type(x.dtype)), cmp = n.op == OpKind::ArgMax ? " > " : " < ";
  auto elem = [&](const std::string& k) { return "row[" + (step == 1 ? k : k + " * " + int_literal(step)) + "]"; };
  Nest nest = open_nest(ke, {{ir::contiguous_strides(ke), 0}, {ks, 0}}, 'i');
  body_.line("const " + T + "* row = " + plus(var_[x.id], nest.off[1]) + ";");
  body_.line("int64_t best = 0;");
  if (ir::is_float(x.dtype)) {
    body_.open("for (int64_t k = 1; k < " + int_literal(len) + " && !isnan(" + elem("best") + "); ++k)");
    body_.line("if (isnan(" + elem("k") + ") || " + elem("k") + cmp + elem("best") + ") best = k;");
  } else {
    body_.open("for (int64_t k = 1; k < " + int_literal(len) + "; ++k)");
    body_.line("if (" + elem("k") + cmp + elem("best") + ") best = k;");
  }
  body_.close();
  body_.line(var_[n.id] + "[" + nest.off[0] + "] = best;");
  body_.close(nest.depth);
}

void Emitter::matmul(const Node& n) {
  const Node &a = in(n, 0), &b = in(n, 1);
  Ints oe = extents(n), ae = extents(a), be = extents(b);
  std::size_t r = oe.size();
  i64 m = oe[r - 2], cols = oe[r - 1], kdim = ae.back();
  // Batch dims broadcast; within a batch, a walks rows and b walks columns.
  Ints batch(oe.begin(), oe.end() - 2);
  Ints as = broadcast_strides(Ints(ae.begin(), ae.end() - 2), batch),
       bs = broadcast_strides(Ints(be.begin(), be.end() - 2), batch);
  for (auto& s : as) s *= m * kdim;
  for (auto& s : bs) s *= kdim * cols;
  as.insert(as.end(), {kdim, 0});
  bs.insert(bs.end(), {0, 1});
  Nest nest = open_nest(oe, {{ir::contiguous_strides(oe), 0}, {as, 0}, {bs, 0}}, 'i');
  const std::string T(c_type(n.dtype));
  const bool fl = ir::is_float(n.dtype);
  body_.line("const " + T + "* ra = " + plus(var_[a.id], nest.off[1]) + ";");
  body_.line("const " + T + "* rb = " + plus(var_[b.id], nest.off[2]) + ";");
  body_.line(std::string(fl ? "double" : "uint64_t") + " acc = 0;");
  std::string bk = cols == 1 ? "rb[k]" : "rb[k * " + int_literal(cols) + "]";
  body_.line("for (int64_t k = 0; k < " + int_literal(kdim) +
             "; ++k) acc += " + (fl ? "(double)ra[k] * " + bk : "(uint64_t)ra[k] * (uint64_t)" + bk) + ";");
  body_.line(var_[n.id] + "[" + nest.off[0] + "] = (" + T + ")acc;");
  body_.close(nest.depth);
}

void Emitter::copy(const Node& n, NodeId src, const Ints& ext, const Walk& from, const Walk& to) {
  Nest nest = open_nest(ext, {to, from}, 'i');
  body_.line(var_[n.id] + "[" + nest.off[0] + "] = " + at(src, nest.off[1]) + ";");
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
    body_.line(var_[n.id] + "[" + fill.off[0] + "] = " + operand(literal(n.attrs.get_float("value"), n.dtype)) + ";");
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
    body_.line("int64_t k = " + use("index") + "((int64_t)" + at(idx.id, off) + ", " + len + ");");
  };
  switch (n.op) {
    case OpKind::Gather: {  // out[i] = x[i with i[axis] = idx[i]]
      Ints s = xs;
      s[axis] = 0;
      Nest nest = open_nest(ie, {{ir::contiguous_strides(ie), 0}, {ir::contiguous_strides(ie), 0}, {s, 0}}, 'i');
      index(nest.off[1]);
      body_.line(var_[n.id] + "[" + nest.off[0] + "] = " + var_[x.id] + "[" + plus(nest.off[2], "k" + step) + "];");
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
      body_.line(var_[n.id] + "[" + nest.off[0] + "] = " + var_[x.id] + "[" + plus(nest.off[2], "k" + step) + "];");
      body_.close(nest.depth);
      return;
    }
    default: {  // scatter_add: out = x, then out[i with i[axis] = idx[i]] += upd[i]
      const Node& upd = in(n, 2);
      const std::string T(c_type(n.dtype));
      copy(n, x.id, xe, {xs, 0}, {xs, 0});
      Ints s = xs;
      s[axis] = 0;
      Nest nest =
          open_nest(ie, {{ir::contiguous_strides(ie), 0}, {ir::contiguous_strides(extents(upd)), 0}, {s, 0}}, 'i');
      index(nest.off[0]);
      std::string dst = var_[n.id] + "[" + plus(nest.off[2], "k" + step) + "]", u = at(upd.id, nest.off[1]);
      body_.line(ir::is_float(n.dtype) ? dst + " += " + u + ";"
                                       : dst + " = (" + T + ")((uint64_t)" + dst + " + (uint64_t)" + u + ");");
      body_.close(nest.depth);
    }
  }
}

void Emitter::leaf_fill(const Node& n) {
  Ints e = extents(n);
  const std::string T(c_type(n.dtype));
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
    default:
      value = "(" + T + ")(" + float_literal(n.attrs.get_float("mean"), DType::F64) + " + " +
              operand(float_literal(n.attrs.get_float("std"), DType::F64)) + " * " + use("normal") + "(" +
              std::to_string(std::uint64_t(n.attrs.get_int("seed"))) + "ull, (uint64_t)i0))";
  }
  if (e.empty()) {
    body_.line(var_[n.id] + "[0] = " + replace_all(value, "i0", "0") + ";");
    return;
  }
  body_.open("for (int64_t i0 = 0; i0 < " + int_literal(numel(e)) + "; ++i0)");
  body_.line(var_[n.id] + "[i0] = " + value + ";");
  body_.close();
}

void Emitter::emit_node(const Node& n) {
  std::string args;
  for (std::size_t i = 0; i < n.inputs.size(); ++i) args += (i ? ", %" : "%") + std::to_string(n.inputs[i]);
  std::string head = "/* %" + std::to_string(n.id) + " = " + std::string(ir::op_name(n.op)) + "(" + args + ")" +
                     attr_text(n.attrs) + " -> " + type_text(n.dtype, extents(n));
  if (is_view(n.op)) {
    body_.line(head + ": a view of %" + std::to_string(n.inputs[0]) + " */");
    return;
  }
  const std::string T(c_type(n.dtype));
  if (slot_[n.id]) {
    body_.line(head + " */");
    std::string pool = (o_.workspace == WorkspaceMode::Static ? "rlx_ws_" : "ws_") + pool_suffix(slot_[n.id]->pool);
    body_.line(T + "* " + var_[n.id] + " = " + plus(pool, int_literal(slot_[n.id]->offset)) + ";");
  } else {
    body_.line(head + ", into " + var_[n.id] + " */");
  }
  body_.open("");
  const Node* x = n.inputs.empty() ? nullptr : &in(n, 0);
  switch (ir::op_info(n.op).cls) {
    case OpClass::Unary:
    case OpClass::Binary:
    case OpClass::Elementwise: elementwise(n); break;
    case OpClass::Reduce:
      if (n.op == OpKind::ArgMax || n.op == OpKind::ArgMin)
        arg_reduce(n);
      else
        reduce(n);
      break;
    case OpClass::MatMul: matmul(n); break;
    case OpClass::Leaf: leaf_fill(n); break;
    case OpClass::Movement: {
      Ints oe = extents(n), xe = extents(*x), xs = ir::contiguous_strides(xe);
      Walk out{ir::contiguous_strides(oe), 0};
      switch (n.op) {
        case OpKind::Permute: {
          const auto& perm = n.attrs.get_ints("perm");
          Ints s;
          for (auto p : perm) s.push_back(xs[std::size_t(p)]);
          copy(n, x->id, oe, {s, 0}, out);
          break;
        }
        case OpKind::Expand: copy(n, x->id, oe, {broadcast_strides(xe, oe), 0}, out); break;
        case OpKind::Slice: {
          const auto &starts = n.attrs.get_ints("starts"), &steps = n.attrs.get_ints("steps");
          Walk from{xs, 0};
          for (std::size_t d = 0; d < xe.size(); ++d) {
            from.base += starts[d] * xs[d];
            from.strides[d] *= steps[d];
          }
          copy(n, x->id, oe, from, out);
          break;
        }
        case OpKind::Flip: {
          Walk from{xs, 0};
          for (auto a : n.attrs.get_ints("axes")) {
            auto d = std::size_t(ir::normalize_axis(a, xe.size()));
            if (xe[d] == 0) continue;
            from.base += (xe[d] - 1) * xs[d];
            from.strides[d] = -xs[d];
          }
          copy(n, x->id, oe, from, out);
          break;
        }
        case OpKind::Concat: concat(n); break;
        case OpKind::Pad: pad(n); break;
        case OpKind::Gather:
        case OpKind::IndexSelect:
        case OpKind::ScatterAdd: indexed(n); break;
        default: fail(n, "has no C lowering");
      }
      break;
    }
    default: fail(n, "has no C lowering (composites and custom ops must be lowered to primitives first)");
  }
  body_.close();
}

std::string Emitter::signature() const {
  std::vector<std::string> args;
  for (const auto& a : src_.inputs) args.push_back("const " + std::string(c_type(a.dtype)) + "* " + a.c_name);
  for (const auto& a : src_.params) args.push_back("const " + std::string(c_type(a.dtype)) + "* " + a.c_name);
  for (const auto& a : src_.outputs) args.push_back(std::string(c_type(a.dtype)) + "* " + a.c_name);
  if (o_.workspace == WorkspaceMode::Caller) args.push_back("void* workspace");
  std::string s = "void " + src_.function_name + "(";
  std::string pad(s.size(), ' ');
  for (std::size_t i = 0; i < args.size(); ++i) s += (i ? (args.size() > 4 ? ",\n" + pad : ", ") : "") + args[i];
  return s + ")";
}

Source Emitter::run() {
  liveness();
  arguments();
  storage();
  // Node comments name leaves by id; this legend says what those ids are.
  std::string legend;
  for (const Node& n : g_.nodes()) {
    if (!needed_[n.id] || !is_external(n.op)) continue;
    std::string what = lit_[n.id].empty() ? var_[n.id] : lit_[n.id];
    std::string item = "%" + std::to_string(n.id) + " " + what;
    std::size_t newline = legend.rfind('\n'), line_start = newline == std::string::npos ? 0 : newline + 1;
    bool wrap = legend.size() - line_start + item.size() > 100;
    legend += legend.empty() ? "/* Leaves: " + item : (wrap ? ",\n   " : ", ") + item;
  }
  if (!legend.empty()) body_.line(legend + " */");
  for (const auto& a : unused_args_) body_.line("(void)" + a + ";");
  // A zero-size buffer may be named by no loop at all; -Wunused-parameter must not fire.
  for (const auto* args : {&src_.inputs, &src_.params, &src_.outputs})
    for (const auto& a : *args)
      if (numel(a.shape) == 0 && std::find(unused_args_.begin(), unused_args_.end(), a.c_name) == unused_args_.end())
        body_.line("(void)" + a.c_name + ";");
  if (o_.workspace == WorkspaceMode::Caller) {
    if (pools_.empty()) body_.line("(void)workspace;");
    for (const auto& [pool, at] : pool_at_) {
      std::string ct(c_type(pool));
      body_.line(ct + "* ws_" + pool_suffix(pool) + " = (" + ct + "*)((unsigned char*)workspace + " + int_literal(at) +
                 ");");
    }
  }
  for (const Node& n : g_.nodes())
    if (needed_[n.id] && !is_external(n.op)) emit_node(n);
  for (std::size_t j = 0; j < g_.outputs().size(); ++j) {
    if (direct_[j]) continue;
    NodeId id = g_.outputs()[j].node;
    const Arg& out = src_.outputs[j];
    body_.line("/* output '" + out.name + "' is %" + std::to_string(id) + " */");
    i64 count = numel(out.shape);
    if (!lit_[id].empty()) {
      body_.line("for (int64_t i0 = 0; i0 < " + int_literal(count) + "; ++i0) " + out.c_name +
                 "[i0] = " + operand(lit_[id]) + ";");
    } else if (count > 0) {
      body_.line("memcpy(" + out.c_name + ", " + var_[id] + ", " + int_literal(count * i64(ir::dtype_size(out.dtype))) +
                 ");");
    }
  }

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
  std::string ws =
      o_.workspace == WorkspaceMode::Caller
          ? "caller-provided, " + upper + "_WORKSPACE_BYTES bytes, 16-byte aligned (reentrant)"
          : std::to_string(src_.workspace_bytes) + " bytes, static in " + src_.source_file + " (not reentrant)";
  std::string h = "/* " + src_.header_file + ": generated by rlx::codegen::c from graph '" + g_.name() +
                  "'. Do not edit.\n *\n * Inputs:    " + list(src_.inputs) + "\n * Params:    " + params +
                  "\n * Outputs:   " + list(src_.outputs) + "\n * Workspace: " + ws +
                  "\n * Buffers are row-major and must not overlap. */\n#ifndef RLX_GEN_" + upper +
                  "_H\n#define RLX_GEN_" + upper +
                  "_H\n\n#include <stdint.h>\n\n#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n";
  if (o_.workspace == WorkspaceMode::Caller)
    h += "#define " + upper + "_WORKSPACE_BYTES " + std::to_string(src_.workspace_bytes) + "\n\n";
  h += signature() + ";\n\n#ifdef __cplusplus\n}\n#endif\n\n#endif\n";
  src_.header = std::move(h);

  std::string c = "/* " + src_.source_file + ": generated by rlx::codegen::c from graph '" + g_.name() + "' (" +
                  std::to_string(g_.size()) + " nodes after decomposition). Do not edit.\n" +
                  " * Needs only the C99 standard library; link with -lm. */\n#include \"" + src_.header_file +
                  "\"\n\n#include <math.h>\n#include <stdint.h>\n#include <string.h>\n\n";
  if (std::string hs = helpers(); !hs.empty()) c += hs + "\n";
  if (o_.workspace == WorkspaceMode::Static && !pools_.empty()) {
    c += "/* The workspace: one pool per element type. */\n";
    for (const auto& [pool, elems] : pools_)
      c +=
          "static " + std::string(c_type(pool)) + " rlx_ws_" + pool_suffix(pool) + "[" + std::to_string(elems) + "];\n";
    c += "\n";
  }
  if (!statics_.str().empty()) c += statics_.str() + "\n";
  c += signature() + " {\n";
  std::string body = body_.str();
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

Source emit(const ir::Graph& g, const Options& options) {
  if (g.outputs().empty()) throw Error("codegen::c: graph '" + g.name() + "' has no outputs");
  for (const Node& n : g.nodes()) {
    if (n.dtype == DType::F16 || n.dtype == DType::BF16)
      throw Error("codegen::c: " + ir::describe_node(g, n) + ": dtype " + std::string(ir::dtype_name(n.dtype)) +
                  " is not supported by the C target (f32, f64, i8, u8, i32, i64 and bool are)");
    if (!n.shape.is_static())
      throw Error("codegen::c: " + ir::describe_node(g, n) + ": shape " + n.shape.str() +
                  " is symbolic; bind it first (ir::bind_symbols)");
  }
  std::string fn = options.function_name;
  if (fn.empty()) {
    std::set<std::string, std::less<>> none;
    fn = identifier(g.name(), none);
    while (is_libc_name(fn)) fn += '_';
  } else if (!std::all_of(fn.begin(), fn.end(),
                          [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; }) ||
             std::isdigit(static_cast<unsigned char>(fn[0])) || reserved_names().contains(fn) || is_libc_name(fn) ||
             is_local_name(fn)) {
    throw Error("codegen::c: function name '" + fn +
                "' is not usable as the C function name: it must be an identifier that is no C keyword, "
                "C library function or name the generated code reserves (rlx_*, ws_*, v<n>, i<n>, r<n>)");
  }
  // Custom ops become their lowering, then composites their primitives: C needs no kernels of its own.
  ir::Graph decomposed = compile::passes::decompose(compile::passes::inline_custom(g, {}), {});
  return Emitter(decomposed, options, std::move(fn)).run();
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
