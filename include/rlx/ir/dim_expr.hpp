#pragma once
// Symbolic dims as expressions (docs/ir.md, "Shape and symbolic dims").
//
// A symbolic Dim's `sym` is the canonical text of an integer expression over named symbols: a symbol
// (`B`), sums and products of symbols and integers (`B*S`, `S+1`, `2*S-1`), and floor division and
// remainder by a positive integer (`floordiv(S+1,2)`, `mod(S,8)`). Because the text is canonical, Dim's
// equality is the expressions' equality, so every layer that treats a symbolic dim as opaque
// (broadcasting's "a symbol matches itself or 1", inference, the verifier, CSE's hashing) handles
// expressions unchanged. Only the code that computes with dims reads the expression: binding
// (bind_symbols), the text form and the ONNX importer's shape arithmetic.
//
//   DimExpr b = DimExpr::symbol("B"), s = DimExpr::symbol("S");
//   Dim d = (b * s).dim();                 // sym "B*S"
//   DimExpr::of(d).eval({{"B", 2}, {"S", 8}})  // 16
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rlx/ir/shape.hpp"

namespace rlx::ir {

class DimExpr {
 public:
  DimExpr(std::int64_t value = 0);  // NOLINT(google-explicit-constructor): integers read as expressions
  static DimExpr symbol(std::string name);
  // Parses the canonical text (and any equivalent spelling: spaces, any term order, parentheses).
  // Throws rlx::Error naming the text and what is wrong.
  static DimExpr parse(std::string_view text);
  // The expression of a dim: its extent, or its `sym` parsed. A `sym` that does not parse (a name made by
  // Dim::symbol such as "my dim") is one symbol with that name.
  static DimExpr of(const Dim& d);

  // A static Dim for a constant, else a symbolic one whose `sym` is str().
  Dim dim() const;
  // The canonical text: terms ordered by their atoms, the constant last; a symbol that is not an
  // identifier is quoted.
  std::string str() const;
  std::optional<std::int64_t> constant() const;
  bool is_symbol() const;  // exactly one symbol, coefficient 1
  bool operator==(const DimExpr& o) const { return str() == o.str(); }

  DimExpr operator+(const DimExpr& o) const;
  DimExpr operator-(const DimExpr& o) const;
  DimExpr operator*(const DimExpr& o) const;
  // Floor division and remainder by a positive integer (Python's // and %); rlx::Error for k < 1.
  DimExpr floordiv(std::int64_t k) const;
  DimExpr mod(std::int64_t k) const;
  // *this / d when it divides exactly as polynomials (B*S*384 / 384 = B*S, B*S*384 / (B*S) = 384), else nullopt.
  std::optional<DimExpr> exact_div(const DimExpr& d) const;

  // Bound symbols replaced by their extents; the rest stay symbolic.
  DimExpr substitute(std::span<const std::pair<std::string, std::int64_t>> bindings) const;
  // The value under `bindings`; rlx::Error naming the symbols left unbound.
  std::int64_t eval(std::span<const std::pair<std::string, std::int64_t>> bindings) const;
  // The names of the symbols it reads (inside floordiv and mod too).
  void symbols(std::set<std::string, std::less<>>& out) const;

  struct Atom;  // a symbol, or floordiv/mod of an expression by an integer (dim_expr.cpp)

 private:
  using Monomial = std::vector<std::shared_ptr<const Atom>>;  // sorted by the atoms' text
  struct Term {
    Monomial atoms;
    std::int64_t coeff = 0;
  };
  // Monomial text ("" for the constant) -> term; no zero coefficients.
  std::map<std::string, Term> terms_;

  void add_term(const Monomial& atoms, std::int64_t coeff);
  static DimExpr of_atom(std::shared_ptr<const Atom> a);
  friend struct DimExprParser;
};

// The symbols a shape's dims read.
std::set<std::string, std::less<>> shape_symbols(const Shape& s);
// The product of a shape's dims as an expression.
DimExpr shape_numel(const Shape& s);

}  // namespace rlx::ir
