#include "rlx/ir/shape.hpp"

#include "rlx/error.hpp"

namespace rlx::ir {

Shape::Shape(std::initializer_list<std::int64_t> dims) {
  for (auto d : dims) dims_.emplace_back(d);
}
Shape::Shape(const std::vector<std::int64_t>& dims) {
  for (auto d : dims) dims_.emplace_back(d);
}

bool Shape::is_static() const {
  for (const auto& d : dims_)
    if (!d.is_static()) return false;
  return true;
}

std::vector<std::int64_t> Shape::extents() const {
  std::vector<std::int64_t> out;
  out.reserve(dims_.size());
  for (const auto& d : dims_) {
    if (!d.is_static()) throw Error("shape " + str() + " has the unbound symbolic dim '" + d.sym + "'");
    out.push_back(d.size);
  }
  return out;
}

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (auto e : extents()) n *= e;
  return n;
}

std::string Shape::str() const {
  std::string s = "[";
  for (std::size_t i = 0; i < dims_.size(); ++i) s += (i ? "," : "") + dims_[i].str();
  return s + "]";
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  std::size_t r = std::max(a.rank(), b.rank());
  std::vector<Dim> out(r);
  for (std::size_t i = 0; i < r; ++i) {
    const Dim one(1);
    const Dim& da = i < r - a.rank() ? one : a[i - (r - a.rank())];
    const Dim& db = i < r - b.rank() ? one : b[i - (r - b.rank())];
    if (da == db || db == one) out[i] = da;
    else if (da == one) out[i] = db;
    else throw Error("shapes " + a.str() + " and " + b.str() + " do not broadcast (dim " + std::to_string(i) + ": " +
                     da.str() + " vs " + db.str() + ")");
  }
  return Shape(std::move(out));
}

std::int64_t normalize_axis(std::int64_t axis, std::size_t rank) {
  // A scalar accepts axis 0 or -1 (it behaves as a row of one), like numpy's reductions.
  auto r = std::max<std::int64_t>(static_cast<std::int64_t>(rank), 1);
  if (axis < -r || axis >= r)
    throw Error("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + r : axis;
}

std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& extents) {
  std::vector<std::int64_t> s(extents.size());
  std::int64_t acc = 1;
  for (std::size_t i = extents.size(); i-- > 0;) {
    s[i] = acc;
    acc *= extents[i];
  }
  return s;
}

}  // namespace rlx::ir
