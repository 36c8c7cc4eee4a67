#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace rlx::ir {

// One dimension: a static extent, or a named symbol ("B", "seq"). Symbols are
// bound at compile time (CompileOptions::bind); each binding is its own
// compiled graph (run-time binding up to a bound is planned). A symbol's extent is -1.
struct Dim {
  std::int64_t size = 0;
  std::string sym;  // empty for a static dim

  Dim() = default;
  Dim(std::int64_t s) : size(s) {}  // NOLINT(google-explicit-constructor): dims read like ints
  static Dim symbol(std::string name) {
    Dim d;
    d.size = -1;
    d.sym = std::move(name);
    return d;
  }
  bool is_static() const { return sym.empty(); }
  bool operator==(const Dim& o) const { return size == o.size && sym == o.sym; }
  std::string str() const { return is_static() ? std::to_string(size) : sym; }
};

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims);
  explicit Shape(const std::vector<std::int64_t>& dims);
  explicit Shape(std::vector<Dim> dims) : dims_(std::move(dims)) {}

  std::size_t rank() const { return dims_.size(); }
  const Dim& operator[](std::size_t i) const { return dims_[i]; }
  Dim& operator[](std::size_t i) { return dims_[i]; }
  const std::vector<Dim>& dims() const { return dims_; }
  std::vector<Dim>& dims() { return dims_; }
  bool is_static() const;
  // Extents as integers; throws rlx::Error if a dim is symbolic.
  std::vector<std::int64_t> extents() const;
  // Element count; throws rlx::Error if a dim is symbolic or the count passes limits::kMaxElements.
  std::int64_t numel() const;
  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;  // "[2,3,B]"

 private:
  std::vector<Dim> dims_;
};

// Throws rlx::Error naming `what` unless the shape is within limits: rank at
// most limits::kMaxRank, static extents >= 0, and the product of the static
// extents at most limits::kMaxElements. Every shape that enters a graph passes
// through it (infer_type checks each node's result), so code past the IR can
// multiply extents without overflow checks.
void check_shape(const Shape& shape, std::string_view what);
// The element count of static extents, checked the same way.
std::int64_t checked_numel(const std::vector<std::int64_t>& extents, std::string_view what = "a tensor");

// NumPy broadcasting; throws rlx::Error naming both shapes when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b);
// Normalizes a possibly negative axis against `rank`; throws on out of range.
std::int64_t normalize_axis(std::int64_t axis, std::size_t rank);
// Row-major contiguous strides, in elements.
std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& extents);

}  // namespace rlx::ir
