// Dim expressions: integer polynomials over atoms (symbols, and floordiv/mod of an expression by an
// integer), kept canonical so that equal expressions print the same text (include/rlx/ir/dim_expr.hpp).
#include "rlx/ir/dim_expr.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "ir/text_lexis.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/limits.hpp"

namespace rlx::ir {

struct DimExpr::Atom {
  std::string name;                    // a symbol, when arg is null
  std::shared_ptr<const DimExpr> arg;  // floordiv(arg, k) or mod(arg, k)
  std::int64_t k = 0;
  bool is_mod = false;
  std::string text;  // canonical text: the sort key and the printed form
};

namespace {

using text_lexis::is_ident_char;
using text_lexis::is_ident_start;
using text_lexis::is_identifier;
using text_lexis::quote;

std::int64_t floor_div(std::int64_t a, std::int64_t k) {
  std::int64_t q = a / k;
  if ((a % k != 0) && ((a < 0) != (k < 0))) --q;
  return q;
}
std::int64_t floor_mod(std::int64_t a, std::int64_t k) { return a - floor_div(a, k) * k; }

constexpr std::string_view kWhat = "a dim expression";
// Bounds that keep a hostile expression (IR text is untrusted input) from taking quadratic time or
// exponential memory: B*B*...*B of 100,000 factors, or a product of 30 sums of 10 symbols.
constexpr std::size_t kMaxTerms = 256;
constexpr std::size_t kMaxDegree = 64;

}  // namespace

DimExpr::DimExpr(std::int64_t value) {
  if (value != 0) terms_[""] = Term{{}, value};
}

DimExpr DimExpr::of_atom(std::shared_ptr<const Atom> a) {
  DimExpr e;
  e.add_term({std::move(a)}, 1);
  return e;
}

DimExpr DimExpr::symbol(std::string name) {
  if (name.empty()) throw Error("a symbolic dim needs a name");
  auto a = std::make_shared<Atom>();
  a->text = is_identifier(name) ? name : quote(name);
  a->name = std::move(name);
  return of_atom(std::move(a));
}

void DimExpr::add_term(const Monomial& atoms, std::int64_t coeff) {
  if (coeff == 0) return;
  if (atoms.size() > kMaxDegree)
    throw Error(fmt::format("a dim expression has a product of more than {} factors", kMaxDegree));
  std::string key;
  for (const auto& a : atoms) key += (key.empty() ? "" : "*") + a->text;
  auto [it, fresh] = terms_.try_emplace(key, Term{atoms, 0});
  it->second.coeff = limits::checked_add(it->second.coeff, coeff, kWhat);
  if (it->second.coeff == 0) terms_.erase(it);
  if (terms_.size() > kMaxTerms) throw Error(fmt::format("a dim expression has more than {} terms", kMaxTerms));
}

std::optional<std::int64_t> DimExpr::constant() const {
  if (terms_.empty()) return 0;
  if (terms_.size() == 1 && terms_.begin()->first.empty()) return terms_.begin()->second.coeff;
  return std::nullopt;
}

bool DimExpr::is_symbol() const {
  if (terms_.size() != 1) return false;
  const Term& t = terms_.begin()->second;
  return t.coeff == 1 && t.atoms.size() == 1 && !t.atoms[0]->arg;
}

Dim DimExpr::dim() const {
  if (auto c = constant()) return Dim(*c);
  return Dim::symbol(str());
}

std::string DimExpr::str() const {
  if (terms_.empty()) return "0";
  std::string out;
  auto term = [&](const std::string& key, const Term& t) {
    std::string s;
    if (key.empty()) {
      s = std::to_string(t.coeff);
    } else {
      s = t.coeff == 1 ? "" : t.coeff == -1 ? "-" : std::to_string(t.coeff) + "*";
      s += key;
    }
    if (!out.empty() && s[0] != '-') out += '+';
    out += s;
  };
  for (const auto& [key, t] : terms_)
    if (!key.empty()) term(key, t);
  if (auto it = terms_.find(""); it != terms_.end()) term("", it->second);
  return out;
}

DimExpr DimExpr::operator+(const DimExpr& o) const {
  DimExpr r = *this;
  for (const auto& [key, t] : o.terms_) r.add_term(t.atoms, t.coeff);
  return r;
}

DimExpr DimExpr::operator-(const DimExpr& o) const { return *this + o * DimExpr(-1); }

DimExpr DimExpr::operator*(const DimExpr& o) const {
  DimExpr r;
  for (const auto& [ka, a] : terms_)
    for (const auto& [kb, b] : o.terms_) {
      Monomial m = a.atoms;
      m.insert(m.end(), b.atoms.begin(), b.atoms.end());
      std::sort(m.begin(), m.end(), [](const auto& x, const auto& y) { return x->text < y->text; });
      r.add_term(m, limits::checked_mul(a.coeff, b.coeff, kWhat));
    }
  return r;
}

DimExpr DimExpr::floordiv(std::int64_t k) const {
  if (k < 1)
    throw Error(fmt::format("dim expression floordiv({},{}): the divisor must be a positive integer", str(), k));
  if (auto c = constant()) return floor_div(*c, k);
  if (std::all_of(terms_.begin(), terms_.end(), [&](const auto& kv) { return kv.second.coeff % k == 0; })) {
    DimExpr r;
    for (const auto& [key, t] : terms_) r.add_term(t.atoms, t.coeff / k);
    return r;
  }
  auto a = std::make_shared<Atom>();
  a->arg = std::make_shared<const DimExpr>(*this);
  a->k = k;
  a->text = fmt::format("floordiv({},{})", str(), k);
  return of_atom(std::move(a));
}

DimExpr DimExpr::mod(std::int64_t k) const {
  if (k < 1) throw Error(fmt::format("dim expression mod({},{}): the divisor must be a positive integer", str(), k));
  if (auto c = constant()) return floor_mod(*c, k);
  if (std::all_of(terms_.begin(), terms_.end(), [&](const auto& kv) { return kv.second.coeff % k == 0; }))
    return DimExpr(0);
  auto a = std::make_shared<Atom>();
  a->arg = std::make_shared<const DimExpr>(*this);
  a->k = k;
  a->is_mod = true;
  a->text = fmt::format("mod({},{})", str(), k);
  return of_atom(std::move(a));
}

std::optional<DimExpr> DimExpr::exact_div(const DimExpr& d) const {
  if (auto c = d.constant()) {
    if (*c == 0) return std::nullopt;
    DimExpr r;
    for (const auto& [key, t] : terms_) {
      if (t.coeff % *c != 0) return std::nullopt;
      r.add_term(t.atoms, t.coeff / *c);
    }
    return r;
  }
  if (d.terms_.size() != 1) {
    if (*this == d) return DimExpr(1);
    return std::nullopt;
  }
  const Term& dt = d.terms_.begin()->second;
  DimExpr r;
  for (const auto& [key, t] : terms_) {
    if (t.coeff % dt.coeff != 0) return std::nullopt;
    Monomial rest = t.atoms;
    for (const auto& a : dt.atoms) {
      auto it = std::find_if(rest.begin(), rest.end(), [&](const auto& x) { return x->text == a->text; });
      if (it == rest.end()) return std::nullopt;
      rest.erase(it);
    }
    r.add_term(rest, t.coeff / dt.coeff);
  }
  return r;
}

DimExpr DimExpr::substitute(std::span<const std::pair<std::string, std::int64_t>> bindings) const {
  DimExpr r;
  for (const auto& [key, t] : terms_) {
    DimExpr term(t.coeff);
    for (const auto& a : t.atoms) {
      DimExpr f;
      if (!a->arg) {
        auto b = std::find_if(bindings.begin(), bindings.end(), [&](const auto& kv) { return kv.first == a->name; });
        f = b == bindings.end() ? of_atom(a) : DimExpr(b->second);
      } else {
        const DimExpr inner = a->arg->substitute(bindings);
        f = a->is_mod ? inner.mod(a->k) : inner.floordiv(a->k);
      }
      term = term * f;
    }
    r = r + term;
  }
  return r;
}

std::int64_t DimExpr::eval(std::span<const std::pair<std::string, std::int64_t>> bindings) const {
  const DimExpr r = substitute(bindings);
  if (auto c = r.constant()) return *c;
  std::set<std::string, std::less<>> left;
  r.symbols(left);
  std::string names;
  for (const auto& s : left) names += (names.empty() ? "" : ", ") + s;
  throw Error(fmt::format("dim expression {}: the symbols {} are not bound", str(), names));
}

void DimExpr::symbols(std::set<std::string, std::less<>>& out) const {
  for (const auto& [key, t] : terms_)
    for (const auto& a : t.atoms) {
      if (a->arg)
        a->arg->symbols(out);
      else
        out.insert(a->name);
    }
}

// ---- parsing ----
//   expr   = term { ("+" | "-") term }
//   term   = factor { "*" factor }
//   factor = INT | IDENT | STRING | "(" expr ")" | "-" factor
//          | ("floordiv" | "mod") "(" expr "," INT ")"
struct DimExprParser {
  std::string_view s;
  std::size_t i = 0;
  int depth = 0;

  [[noreturn]] void fail(std::string_view what) const {
    // A long text is cut (an error message from hostile input stays short).
    const std::string shown = s.size() <= 80 ? std::string(s) : std::string(s.substr(0, 60)) + "...";
    throw Error(fmt::format("dim expression '{}': {} at offset {}", shown, what, i));
  }
  void skip() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  bool accept(char c) {
    skip();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!accept(c)) fail(fmt::format("expected '{}'", c));
  }
  std::int64_t integer() {
    skip();
    const std::size_t start = i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    if (i == start) fail("expected an integer");
    std::int64_t v = 0;
    for (std::size_t j = start; j < i; ++j)
      v = limits::checked_add(limits::checked_mul(v, 10, kWhat), s[j] - '0', kWhat);
    return v;
  }
  DimExpr expr() {
    if (++depth > 64) fail("nested more than 64 levels");
    DimExpr e = term();
    for (;;) {
      if (accept('+'))
        e = e + term();
      else if (accept('-'))
        e = e - term();
      else
        break;
    }
    --depth;
    return e;
  }
  DimExpr term() {
    DimExpr e = factor();
    while (accept('*')) e = e * factor();
    return e;
  }
  DimExpr factor() {
    skip();
    if (i >= s.size()) fail("unexpected end");
    const char c = s[i];
    if (accept('-')) {  // counted as nesting: "- - - ... B" recurses once per sign
      if (++depth > 64) fail("nested more than 64 levels");
      DimExpr e = DimExpr(-1) * factor();
      --depth;
      return e;
    }
    if (accept('(')) {
      DimExpr e = expr();
      expect(')');
      return e;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return integer();
    if (c == '"') {
      std::string name;
      for (++i;; ++i) {
        if (i >= s.size()) fail("unterminated string");
        if (s[i] == '"') break;
        if (s[i] != '\\') {
          name += s[i];
          continue;
        }
        const char e = ++i < s.size() ? s[i] : '\0';
        if (e == 'n')
          name += '\n';
        else if (e == 't')
          name += '\t';
        else if (e == '"' || e == '\\')
          name += e;
        else if (e == 'x' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
                 std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
          name += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
          i += 2;
        } else {
          fail("bad escape sequence");
        }
      }
      ++i;
      return DimExpr::symbol(std::move(name));
    }
    if (is_ident_start(c)) {
      const std::size_t start = i;
      while (i < s.size() && is_ident_char(s[i])) ++i;
      const std::string_view name = s.substr(start, i - start);
      if ((name == "floordiv" || name == "mod") && accept('(')) {
        DimExpr e = expr();
        expect(',');
        const std::int64_t k = integer();
        expect(')');
        return name == "mod" ? e.mod(k) : e.floordiv(k);
      }
      return DimExpr::symbol(std::string(name));
    }
    fail(fmt::format("unexpected character '{}'", c));
  }
};

DimExpr DimExpr::parse(std::string_view text) {
  DimExprParser p{text};
  DimExpr e = p.expr();
  p.skip();
  if (p.i != text.size()) p.fail("unexpected text after the expression");
  return e;
}

DimExpr DimExpr::of(const Dim& d) {
  if (d.is_static()) return DimExpr(d.size);
  if (is_identifier(d.sym)) return symbol(d.sym);
  try {
    return parse(d.sym);
  } catch (const Error&) {
    return symbol(d.sym);
  }
}

std::set<std::string, std::less<>> shape_symbols(const Shape& s) {
  std::set<std::string, std::less<>> out;
  for (const auto& d : s.dims())
    if (!d.is_static()) DimExpr::of(d).symbols(out);
  return out;
}

DimExpr shape_numel(const Shape& s) {
  DimExpr n(1);
  for (const auto& d : s.dims()) n = n * DimExpr::of(d);
  return n;
}

}  // namespace rlx::ir
