#include "rlx/ir/text.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <type_traits>
#include <utility>
#include <variant>

#include "ir/text_lexis.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/ir/dim_expr.hpp"
#include "rlx/ir/limits.hpp"

namespace rlx::ir {
namespace {

using text_lexis::is_ident_char;
using text_lexis::is_ident_start;
using text_lexis::is_identifier;
using text_lexis::quote;
bool is_label_char(char c) { return is_ident_char(c) || c == '.'; }

// ---- printing --------------------------------------------------------------

std::string ident_or_quoted(const std::string& s) { return is_identifier(s) ? s : quote(s); }

// A symbolic dim: a dim expression in its canonical text prints as it is (B*S, floordiv(S+1,2)); any
// other name (one made by Dim::symbol that is not an expression) is quoted, as symbols always were.
std::string dim_text(const std::string& sym) {
  if (is_identifier(sym)) return sym;
  try {
    if (DimExpr::parse(sym).str() == sym) return sym;
  } catch (const Error&) {
  }
  return quote(sym);
}

std::string format_g(double v, int digits) {
  if (std::isnan(v)) return "nan";  // printf may say "-nan"; the sign of a NaN is not kept
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

// Float attributes always show a '.' or an exponent so that the parser can
// tell them from ints without the schema.
std::string format_float_attr(double v) {
  std::string s = format_g(v, 17);
  if (std::isfinite(v) && s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

// Bodies are printed once per graph block, before their first use, and
// referred to by label.
using BodyLabels = std::map<const Graph*, std::string>;

std::string format_attr(const AttrValue& value, const BodyLabels& bodies) {
  return std::visit(
      [&](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::int64_t>)
          return std::to_string(v);
        else if constexpr (std::is_same_v<T, GraphRef>)
          return "@" + bodies.at(v.get());
        else if constexpr (std::is_same_v<T, double>)
          return format_float_attr(v);
        else if constexpr (std::is_same_v<T, bool>)
          return v ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::string>)
          return quote(v);
        else if constexpr (std::is_same_v<T, DType>)
          return std::string(dtype_name(v));
        else
          return fmt::format("[{}]", fmt::join(v, ", "));
      },
      value);
}

}  // namespace

std::string attr_value_str(const AttrValue& value) {
  if (std::holds_alternative<GraphRef>(value)) return "@body";
  return format_attr(value, {});
}

namespace {

std::string format_type(DType dtype, const Shape& shape) {
  std::string out = fmt::format("{}[", dtype_name(dtype));
  for (std::size_t i = 0; i < shape.rank(); ++i) {
    if (i) out += ',';
    out += shape[i].is_static() ? std::to_string(shape[i].size) : dim_text(shape[i].sym);
  }
  return out + ']';
}

std::string format_element(const Tensor& t, std::int64_t i) {
  switch (t.dtype()) {
    case DType::F32:
    case DType::F16:
    case DType::BF16: return format_g(t.get(i), 9);
    case DType::F64: return format_g(t.get(i), 17);
    case DType::I64: return std::to_string(t.data_as<std::int64_t>()[i]);  // beyond 2^53 doubles are inexact
    case DType::U64: return std::to_string(t.data_as<std::uint64_t>()[i]);
    case DType::Bool: return t.get(i) != 0 ? "true" : "false";
    default:
      if (is_storage_float(t.dtype())) return format_g(t.get(i), 9);
      return std::to_string(static_cast<std::int64_t>(t.get(i)));
  }
}

bool has_positional_name(const Node& n) {
  if (n.op != OpKind::Input && n.op != OpKind::Param) return false;
  auto it = n.attrs.items().find("name");
  return it != n.attrs.items().end() && std::holds_alternative<std::string>(it->second);
}

void print_node(std::string& out, const Node& n, const BodyLabels& bodies, const std::string& indent) {
  out += fmt::format("{}%{} = {}", indent, n.id, op_name(n.op));
  const bool positional_name = has_positional_name(n);
  if (positional_name) out += ' ' + quote(n.attrs.get_str("name"));
  for (std::size_t i = 0; i < n.inputs.size(); ++i) out += fmt::format("{}%{}", i ? ", " : " ", n.inputs[i]);
  std::vector<std::string> attrs;
  if (n.op == OpKind::Constant && n.value) {
    std::string v = "value=[";
    for (std::int64_t i = 0; i < n.value->numel(); ++i) v += (i ? ", " : "") + format_element(*n.value, i);
    attrs.push_back(v + ']');
  }
  for (const auto& [key, value] : n.attrs.items())
    if (!(positional_name && key == "name")) attrs.push_back(key + '=' + format_attr(value, bodies));
  if (!attrs.empty()) out += fmt::format(" {{{}}}", fmt::join(attrs, ", "));
  out += " : " + format_type(n.dtype, n.shape) + '\n';
}

// ---- lexing ----------------------------------------------------------------

enum class Tok { Ident, Int, Float, String, Label, BodyLabel, Punct, End };

struct Token {
  Tok kind;
  std::string text;  // decoded contents for strings, the name after '%' for labels
  int line;
  int col;
};

[[noreturn]] void fail_at(int line, int col, std::string_view what) {
  throw Error(fmt::format("line {}, col {}: {}", line, col, what));
}
[[noreturn]] void fail(const Token& t, std::string_view what) { fail_at(t.line, t.col, what); }

std::string describe(const Token& t) {
  switch (t.kind) {
    case Tok::End: return "end of input";
    case Tok::String: return "string " + quote(t.text);
    case Tok::Label: return "'%" + t.text + "'";
    case Tok::BodyLabel: return "'@" + t.text + "'";
    default: return "'" + t.text + "'";
  }
}

std::vector<Token> lex(std::string_view s) {
  std::vector<Token> out;
  int line = 1;
  std::size_t line_start = 0, i = 0;
  auto col = [&](std::size_t at) { return static_cast<int>(at - line_start) + 1; };
  for (;;) {
    while (i < s.size()) {
      if (s[i] == '\n') {
        ++line;
        line_start = ++i;
      } else if (std::isspace(static_cast<unsigned char>(s[i]))) {
        ++i;
      } else if (s.substr(i, 2) == "//") {
        while (i < s.size() && s[i] != '\n') ++i;
      } else {
        break;
      }
    }
    Token t{Tok::End, "", line, col(i)};
    if (i == s.size()) {
      out.push_back(std::move(t));
      return out;
    }
    const std::size_t start = i;
    const char c = s[i];
    if (c == '%' || c == '@') {
      while (++i < s.size() && is_label_char(s[i])) {
      }
      if (i == start + 1) fail(t, fmt::format("expected a label name after '{}'", c));
      t.kind = c == '%' ? Tok::Label : Tok::BodyLabel;
      t.text = s.substr(start + 1, i - start - 1);
    } else if (is_ident_start(c)) {
      while (++i < s.size() && is_ident_char(s[i])) {
      }
      t.kind = Tok::Ident;
      t.text = s.substr(start, i - start);
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      auto digits = [&] {
        while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
      };
      t.kind = Tok::Int;
      digits();
      if (i < s.size() && s[i] == '.') {
        t.kind = Tok::Float;
        ++i;
        digits();
      }
      if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        t.kind = Tok::Float;
        if (++i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
        const std::size_t exp_start = i;
        digits();
        if (i == exp_start) fail(t, fmt::format("malformed number '{}'", s.substr(start, i - start)));
      }
      if (i < s.size() && is_label_char(s[i])) {
        while (i < s.size() && is_label_char(s[i])) ++i;
        fail(t, fmt::format("malformed number '{}'", s.substr(start, i - start)));
      }
      t.text = s.substr(start, i - start);
    } else if (c == '"') {
      t.kind = Tok::String;
      for (++i;; ++i) {
        if (i >= s.size() || s[i] == '\n') fail(t, "unterminated string");
        if (t.text.size() > limits::kMaxStringBytes)
          fail(t, fmt::format("a string is longer than {} bytes", limits::kMaxStringBytes));
        if (s[i] == '"') break;
        if (s[i] != '\\') {
          t.text += s[i];
          continue;
        }
        const int esc_col = col(i);
        const char e = ++i < s.size() ? s[i] : '\0';
        if (e == 'n')
          t.text += '\n';
        else if (e == 't')
          t.text += '\t';
        else if (e == '"' || e == '\\')
          t.text += e;
        else if (e == 'x' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
                 std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
          t.text += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
          i += 2;
        } else {
          fail_at(line, esc_col, "bad escape sequence in string");
        }
      }
      ++i;
    } else if (std::string_view("=,:[]{}-+*()").find(c) != std::string_view::npos) {
      t.kind = Tok::Punct;
      t.text = std::string(1, c);
      ++i;
    } else {
      auto u = static_cast<unsigned char>(c);
      fail(t,
           std::isprint(u) ? fmt::format("unexpected character '{}'", c) : fmt::format("unexpected byte 0x{:02x}", u));
    }
    out.push_back(std::move(t));
  }
}

// ---- parsing ---------------------------------------------------------------

// A numeric or keyword literal: optional '-' then an Int, Float or Ident
// token (true, false, inf, nan). Converted once its target type is known.
struct Literal {
  const Token* minus;  // null when unsigned
  const Token* tok;
  const Token& where() const { return minus ? *minus : *tok; }
  std::string str() const { return (minus ? "-" : "") + tok->text; }
};

std::pair<std::int64_t, std::int64_t> int_range(DType t) {
  // i64's range is int64's (u64's constants parse apart: Parser::to_u64); the others have ranges a double
  // holds exactly.
  if (t == DType::I64 || t == DType::U64)
    return {std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max()};
  const auto [lo, hi] = integer_range(t);
  return {std::int64_t(lo), std::int64_t(hi)};
}

class Parser {
 public:
  explicit Parser(std::string_view text) : toks_(lex(text)) {}

  Graph parse() {
    const Token& kw = peek();
    if (kw.kind == Tok::End) fail(kw, "empty input, expected 'graph'");
    Graph g = parse_graph();
    if (peek().kind != Tok::End) fail(peek(), "unexpected " + describe(peek()) + " after the closing '}'");
    return g;
  }

 private:
  struct Def {
    NodeId id;
    const Token* label;
  };

  // "graph NAME { ... }", verified. Labels (of nodes and bodies) are local to
  // one graph block, so a nested body starts with fresh ones.
  Graph parse_graph() {
    const Token& kw = peek();
    if (!is_word(kw, "graph")) fail(kw, "expected 'graph', got " + describe(kw));
    // Bodies recurse through here: the limit keeps hostile nesting off the stack.
    if (depth_ > limits::kMaxNestingDepth)
      fail(kw, fmt::format("bodies nest more than {} levels deep", limits::kMaxNestingDepth));
    struct Nest {
      std::size_t& d;
      explicit Nest(std::size_t& depth) : d(++depth) {}
      ~Nest() { --d; }
    } nest(depth_);
    next();
    const Token& name = next();
    if (name.kind != Tok::Ident && name.kind != Tok::String) fail(name, "expected a graph name, got " + describe(name));
    expect("{");
    Graph g(name.text);
    for (;;) {
      const Token& t = peek();
      if (is_punct(t, "}")) break;
      if (t.kind == Tok::Label)
        parse_node(g);
      else if (is_word(t, "output"))
        parse_outputs(g);
      else if (is_word(t, "body"))
        parse_body();
      else if (t.kind == Tok::End)
        fail(t, "unexpected end of input, expected '}'");
      else
        fail(t, "expected a node ('%label = op ...'), 'body', 'output' or '}', got " + describe(t));
    }
    next();
    verify(g, kw);
    return g;
  }

  // "body @label = graph NAME { ... }": a control-flow body for the nodes after it.
  void parse_body() {
    next();
    const Token& label = next();
    if (label.kind != Tok::BodyLabel) fail(label, "expected a body label like @b0, got " + describe(label));
    if (bodies_.contains(label.text)) fail(label, fmt::format("duplicate body label @{}", label.text));
    expect("=");
    auto defs = std::exchange(defs_, {});
    auto nodes = std::exchange(nodes_, {});
    auto bodies = std::exchange(bodies_, {});
    Graph body = parse_graph();
    defs_ = std::move(defs);
    nodes_ = std::move(nodes);
    bodies_ = std::move(bodies);
    bodies_.emplace(label.text, std::make_shared<const Graph>(std::move(body)));
  }

  const Token& peek() const { return toks_[pos_]; }
  const Token& next() { return pos_ + 1 < toks_.size() ? toks_[pos_++] : toks_[pos_]; }
  static bool is_punct(const Token& t, std::string_view p) { return t.kind == Tok::Punct && t.text == p; }
  static bool is_word(const Token& t, std::string_view w) { return t.kind == Tok::Ident && t.text == w; }
  bool accept(std::string_view p) {
    if (!is_punct(peek(), p)) return false;
    next();
    return true;
  }
  const Token& expect(std::string_view p) {
    if (!is_punct(peek(), p)) fail(peek(), fmt::format("expected '{}', got {}", p, describe(peek())));
    return next();
  }

  NodeId resolve(const Token& ref) {
    if (ref.kind != Tok::Label) fail(ref, "expected a node label like %0, got " + describe(ref));
    if (auto it = defs_.find(ref.text); it != defs_.end()) return it->second.id;
    for (std::size_t i = pos_; i + 1 < toks_.size(); ++i)
      if (toks_[i].kind == Tok::Label && toks_[i].text == ref.text && is_punct(toks_[i + 1], "="))
        fail(ref, fmt::format("forward reference to %{} (defined on line {}); nodes must be defined before use",
                              ref.text, toks_[i].line));
    fail(ref, fmt::format("undefined node %{}", ref.text));
  }

  Literal literal() {
    Literal lit{nullptr, nullptr};
    if (is_punct(peek(), "-")) lit.minus = &next();
    lit.tok = &next();
    const bool word = lit.tok->kind == Tok::Ident;
    if (lit.tok->kind != Tok::Int && lit.tok->kind != Tok::Float && !word)
      fail(*lit.tok, "expected a value, got " + describe(*lit.tok));
    if (word && lit.minus && lit.tok->text != "inf" && lit.tok->text != "nan")
      fail(lit.where(), fmt::format("bad value '{}'", lit.str()));
    return lit;
  }

  // u64's elements, past int64's range too.
  static std::uint64_t to_u64(const Literal& lit) {
    if (lit.tok->kind != Tok::Int) fail(lit.where(), fmt::format("expected an integer, got '{}'", lit.str()));
    std::uint64_t v = 0;
    const std::string& s = lit.tok->text;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (lit.minus || ec != std::errc() || end != s.data() + s.size())
      fail(lit.where(), fmt::format("integer '{}' out of range for u64", lit.str()));
    return v;
  }

  static std::int64_t to_int(const Literal& lit, DType range = DType::I64) {
    if (lit.tok->kind != Tok::Int) fail(lit.where(), fmt::format("expected an integer, got '{}'", lit.str()));
    std::uint64_t mag = 0;
    const std::string& s = lit.tok->text;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), mag);
    auto [lo, hi] = int_range(range);
    const bool fits =
        ec == std::errc() && end == s.data() + s.size() &&
        (lit.minus ? mag <= std::uint64_t(0) - static_cast<std::uint64_t>(lo) : mag <= static_cast<std::uint64_t>(hi));
    if (!fits) fail(lit.where(), fmt::format("integer '{}' out of range for {}", lit.str(), dtype_name(range)));
    return lit.minus ? static_cast<std::int64_t>(std::uint64_t(0) - mag) : static_cast<std::int64_t>(mag);
  }

  static double to_float(const Literal& lit) {
    const std::string& s = lit.tok->text;
    double v = 0;
    if (s == "inf")
      v = std::numeric_limits<double>::infinity();
    else if (s == "nan")
      v = std::numeric_limits<double>::quiet_NaN();
    else if (lit.tok->kind == Tok::Ident)
      fail(lit.where(), fmt::format("expected a number, got '{}'", s));
    else if (auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
             ec != std::errc() || end != s.data() + s.size())
      fail(lit.where(), fmt::format("number '{}' out of range", lit.str()));
    return lit.minus ? -v : v;
  }

  static bool to_bool(const Literal& lit) {
    if (!lit.minus && is_word(*lit.tok, "true")) return true;
    if (!lit.minus && is_word(*lit.tok, "false")) return false;
    fail(lit.where(), fmt::format("expected true or false, got '{}'", lit.str()));
  }

  DType dtype() {
    const Token& t = next();
    if (t.kind == Tok::Ident) {
      try {
        return parse_dtype(t.text);
      } catch (const Error&) {
      }
    }
    fail(t, "unknown dtype " + describe(t));
  }

  [[noreturn]] static void mismatch(const Token& at, const AttrSpec& spec, OpKind op, std::string_view want) {
    fail(at, fmt::format("attribute '{}' of {} expects {}, got {}", spec.key, op_name(op), want, describe(at)));
  }

  AttrValue attr_value(const AttrSpec& spec, OpKind op) {
    const Token& at = peek();
    const bool literal_next =
        is_punct(at, "-") || at.kind == Tok::Int || at.kind == Tok::Float || at.kind == Tok::Ident;
    switch (spec.type) {
      case AttrType::Int:
        if (!literal_next) mismatch(at, spec, op, "an integer");
        return to_int(literal());
      case AttrType::Float:
        if (!literal_next) mismatch(at, spec, op, "a number");
        return to_float(literal());
      case AttrType::Bool:
        if (!literal_next) mismatch(at, spec, op, "true or false");
        return to_bool(literal());
      case AttrType::String:
        if (at.kind != Tok::String) mismatch(at, spec, op, "a string");
        return next().text;
      case AttrType::DType: return dtype();
      case AttrType::Graph: {
        if (at.kind != Tok::BodyLabel) mismatch(at, spec, op, "a body label like @b0");
        auto it = bodies_.find(next().text);
        if (it == bodies_.end())
          fail(at, fmt::format("undefined body @{} (define it with 'body @{} = graph ...' first)", at.text, at.text));
        return it->second;
      }
      case AttrType::Ints: {
        if (!is_punct(at, "[")) mismatch(at, spec, op, "an int list like [0, 1]");
        next();
        std::vector<std::int64_t> v;
        if (!accept("]")) {
          do v.push_back(to_int(literal()));
          while (accept(","));
          expect("]");
        }
        return v;
      }
    }
    mismatch(at, spec, op, "a value");
  }

  // Parses "{k=v, ...}" into n.attrs (the constant's value goes to `values`).
  void parse_attrs(Node& n, const Token& op_tok, std::vector<Literal>& values, const Token*& values_tok) {
    const auto& schema = op_attr_schema(n.op);
    // A custom op's own attributes are typed by its extension, which is known
    // only once "op" is read: note where they start and parse them afterwards.
    std::vector<std::pair<const Token*, std::size_t>> deferred;
    if (accept("}")) return;
    do {
      const Token& key = next();
      if (key.kind != Tok::Ident) fail(key, "expected an attribute name, got " + describe(key));
      if (n.attrs.has(key.text) || (values_tok && key.text == "value"))
        fail(key, fmt::format("duplicate attribute '{}'", key.text));
      expect("=");
      if (n.op == OpKind::Constant && key.text == "value") {
        values_tok = &expect("[");
        if (!accept("]")) {
          do values.push_back(literal());
          while (accept(","));
          expect("]");
        }
        continue;
      }
      auto spec = std::find_if(schema.begin(), schema.end(), [&](const AttrSpec& s) { return s.key == key.text; });
      if (spec == schema.end() && n.op == OpKind::Custom) {
        deferred.emplace_back(&key, pos_);
        if (accept("[")) {
          while (!accept("]")) next_or_fail(key);
        } else {
          next();
        }
        continue;
      }
      if (spec == schema.end()) {
        std::vector<std::string_view> keys;
        for (const AttrSpec& s : schema) keys.push_back(s.key);
        if (n.op == OpKind::Constant) keys.push_back("value");
        fail(key, fmt::format("unknown attribute '{}' for {} (it takes: {})", key.text, op_tok.text,
                              keys.empty() ? "none" : fmt::format("{}", fmt::join(keys, ", "))));
      }
      n.attrs.set(key.text, attr_value(*spec, n.op));
    } while (accept(","));
    expect("}");
    if (deferred.empty()) return;
    std::vector<AttrSpec> ext_schema;
    try {
      if (!n.attrs.has("op")) fail(op_tok, "custom is missing its 'op' attribute");
      ext_schema = find_op_extension(n.attrs.get_str("op"))->attr_schema();
    } catch (const Error& e) {
      fail(op_tok, e.what());
    }
    const std::size_t resume = pos_;
    for (const auto& [key, at] : deferred) {
      const std::string& wanted = key->text;
      auto spec =
          std::find_if(ext_schema.begin(), ext_schema.end(), [&](const AttrSpec& s) { return s.key == wanted; });
      if (spec == ext_schema.end())
        fail(*key, fmt::format("unknown attribute '{}' for custom op '{}'", key->text, n.attrs.get_str("op")));
      pos_ = at;
      n.attrs.set(key->text, attr_value(*spec, n.op));
    }
    pos_ = resume;
  }

  // Skips one token inside a list; an unterminated list is an error at its key.
  void next_or_fail(const Token& key) {
    if (peek().kind == Tok::End) fail(key, "unterminated list");
    next();
  }

  // A dim written as an expression (B*S, floordiv(S+1,2)): its tokens up to the ',' or ']' that ends the
  // dim, read by DimExpr::parse, whose error is reported at the dim's first token.
  Dim dim_expr(const Token& first) {
    std::string text;
    int depth = 0;
    for (const Token* t = &first;; t = &next()) {
      // Tokens are joined by spaces, so that two names in a row ("B S") stay two and fail to parse.
      if (!text.empty()) text += ' ';
      const bool op = t->kind == Tok::Punct && std::string_view("+-*(),").find(t->text) != std::string_view::npos;
      if (t->kind == Tok::Ident || t->kind == Tok::Int || op)
        text += t->text;
      else if (t->kind == Tok::String)
        text += quote(t->text);
      else
        fail(*t, "expected a dim (an extent, a symbol or a dim expression), got " + describe(*t));
      depth += t->text == "(" && t->kind == Tok::Punct ? 1 : t->text == ")" && t->kind == Tok::Punct ? -1 : 0;
      if (depth < 0) fail(*t, "unbalanced ')' in a dim expression");
      if (depth == 0 && (is_punct(peek(), ",") || is_punct(peek(), "]") || peek().kind == Tok::End)) break;
    }
    Dim d;
    try {
      d = DimExpr::parse(text).dim();
    } catch (const Error& e) {
      fail(first, e.what());
    }
    if (d.is_static() && d.size < 0)
      fail(first,
           fmt::format("expected a dim (an extent, a symbol or a dim expression), got the negative extent {}", d.size));
    return d;
  }

  Shape shape() {
    expect("[");
    std::vector<Dim> dims;
    if (accept("]")) return Shape(std::move(dims));
    do {
      const Token& t = next();
      if (dims.size() == limits::kMaxRank) fail(t, fmt::format("a shape has more than {} dims", limits::kMaxRank));
      // A lone extent or symbol is read as before; an operator after it (or a leading one) makes an expression.
      auto is_op = [](const Token& k) {
        return k.kind == Tok::Punct && std::string_view("+-*(").find(k.text) != std::string_view::npos;
      };
      const bool single = !is_op(peek()) && !is_op(t);
      if (single && (t.kind == Tok::Ident || t.kind == Tok::String))
        dims.push_back(Dim::symbol(t.text));
      else if (single && t.kind == Tok::Int)
        dims.emplace_back(to_int({nullptr, &t}));
      else
        dims.push_back(dim_expr(t));
    } while (accept(","));
    expect("]");
    return Shape(std::move(dims));
  }

  static std::shared_ptr<const Tensor> make_constant(const Node& n, const Token& type_tok,
                                                     const std::vector<Literal>& values, const Token& values_tok) {
    if (!n.shape.is_static()) fail(type_tok, "a constant's shape must be static, got " + format_type(n.dtype, n.shape));
    // Counted before the tensor exists: a huge declared shape must not be allocated to be refused.
    std::int64_t count = 0;
    try {
      count = n.shape.numel();
    } catch (const Error& e) {
      fail(type_tok, e.what());
    }
    if (static_cast<std::int64_t>(values.size()) != count)
      fail(values_tok, fmt::format("constant has {} values but its type {} holds {}", values.size(),
                                   format_type(n.dtype, n.shape), count));
    auto t = std::make_shared<Tensor>(n.dtype, n.shape.extents());
    for (std::size_t i = 0; i < values.size(); ++i) {
      const auto at = static_cast<std::int64_t>(i);
      if (n.dtype == DType::Bool)
        t->set(at, to_bool(values[i]));
      else if (is_float(n.dtype) || is_storage_float(n.dtype))
        t->set(at, to_float(values[i]));
      else if (n.dtype == DType::I64)
        t->data_as<std::int64_t>()[i] = to_int(values[i]);
      else if (n.dtype == DType::U64)
        t->data_as<std::uint64_t>()[i] = to_u64(values[i]);
      else
        t->set(at, static_cast<double>(to_int(values[i], n.dtype)));
    }
    return t;
  }

  void parse_node(Graph& g) {
    const Token& label = next();
    if (auto it = defs_.find(label.text); it != defs_.end())
      fail(label, fmt::format("duplicate label %{} (first defined on line {})", label.text, it->second.label->line));
    expect("=");
    const Token& op_tok = next();
    if (op_tok.kind != Tok::Ident) fail(op_tok, "expected an op name, got " + describe(op_tok));
    auto op = parse_op(op_tok.text);
    if (!op) fail(op_tok, fmt::format("unknown op '{}'", op_tok.text));
    Node n;
    n.op = *op;
    n.id = static_cast<NodeId>(g.size());
    if ((n.op == OpKind::Input || n.op == OpKind::Param) && peek().kind == Tok::String)
      n.attrs.set("name", next().text);
    if (peek().kind == Tok::Label) {
      do n.inputs.push_back(resolve(next()));
      while (accept(","));
    }
    const OpInfo& info = op_info(n.op);
    const auto arity = static_cast<int>(n.inputs.size());
    if (arity < info.min_inputs || arity > info.max_inputs)
      fail(op_tok,
           info.min_inputs == info.max_inputs
               ? fmt::format("{} takes {} operand(s), got {}", info.name, info.min_inputs, arity)
               : fmt::format("{} takes {} to {} operands, got {}", info.name, info.min_inputs, info.max_inputs, arity));
    std::vector<Literal> values;
    const Token* values_tok = nullptr;
    if (accept("{")) parse_attrs(n, op_tok, values, values_tok);
    for (const AttrSpec& s : op_attr_schema(n.op))
      if (s.required && !n.attrs.has(s.key))
        fail(op_tok, fmt::format("{} is missing its '{}' attribute", op_tok.text, s.key));
    if (n.op == OpKind::Constant && !values_tok) fail(op_tok, "constant needs its elements: {value=[...]}");
    expect(":");
    const Token& type_tok = peek();
    n.dtype = dtype();
    n.shape = shape();
    if (values_tok) n.value = make_constant(n, type_tok, values, *values_tok);
    NodeId id;
    try {
      id = g.add_raw(std::move(n));
    } catch (const Error& e) {
      fail(label, e.what());
    }
    defs_.emplace(label.text, Def{id, &label});
    nodes_.push_back(&label);
  }

  void parse_outputs(Graph& g) {
    next();
    do {
      NodeId id = resolve(next());
      std::string name;
      if (peek().kind == Tok::String) name = next().text;
      g.add_output(id, std::move(name));
    } while (accept(","));
  }

  // Runs the verifier and points its error at the line of the node it names
  // (verifier messages start with describe_node's "node %<id>").
  void verify(const Graph& g, const Token& graph_kw) const {
    try {
      g.verify();
    } catch (const Error& e) {
      std::string_view msg = e.what();
      const Token* where = &graph_kw;
      if (auto p = msg.find("node %"); p != std::string_view::npos) {
        std::size_t id = 0;
        auto digits = msg.substr(p + 6);
        auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), id);
        if (ec == std::errc() && id < nodes_.size()) where = nodes_[id];
      }
      fail(*where, msg);
    }
  }

  std::vector<Token> toks_;
  std::size_t pos_ = 0;
  std::size_t depth_ = 0;  // graph blocks open
  std::map<std::string, Def, std::less<>> defs_;
  std::vector<const Token*> nodes_;  // label token per dense id
  std::map<std::string, GraphRef, std::less<>> bodies_;
};

void print_graph(std::string& out, const Graph& g, const std::string& indent) {
  out += fmt::format("graph {} {{\n", ident_or_quoted(g.name()));
  const std::string inner = indent + "  ";
  BodyLabels bodies;
  for (const Node& n : g.nodes()) {
    for (const auto& [key, body] : bodies_of(n)) {
      if (bodies.contains(body->get())) continue;
      std::string label = "b" + std::to_string(bodies.size());
      out += inner + "body @" + label + " = ";
      print_graph(out, **body, inner);
      bodies.emplace(body->get(), std::move(label));
    }
    print_node(out, n, bodies, inner);
  }
  if (!g.outputs().empty()) {
    out += inner + "output";
    for (std::size_t i = 0; i < g.outputs().size(); ++i) {
      const GraphOutput& o = g.outputs()[i];
      out += fmt::format("{}%{}", i ? ", " : " ", o.node);
      if (!o.name.empty()) out += ' ' + quote(o.name);
    }
    out += '\n';
  }
  out += indent + "}\n";
}

}  // namespace

std::string to_text(const Graph& g) {
  std::string out;
  print_graph(out, g, "");
  return out;
}

Graph parse_text(std::string_view text) { return Parser(text).parse(); }

}  // namespace rlx::ir
