#include "rlx/ir/shape.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include "rlx/error.hpp"
#include "rlx/ir/limits.hpp"

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

std::int64_t Shape::numel() const { return checked_numel(extents(), "shape " + str()); }

namespace limits {

std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw Error(fmt::format("{}: {} * {} overflows int64", what, a, b));
  return r;
}

std::int64_t checked_add(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) throw Error(fmt::format("{}: {} + {} overflows int64", what, a, b));
  return r;
}

std::int64_t physical_memory_bytes() {
  static const std::int64_t bytes = [] {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? std::int64_t(pages) * page : std::int64_t(1) << 62;
  }();
  return bytes;
}

void check_allocation(std::int64_t bytes, std::string_view what) {
  if (bytes < 0) throw Error(fmt::format("{}: negative size {} bytes", what, bytes));
  if (bytes > physical_memory_bytes())
    throw Error(fmt::format("{} needs {} bytes ({:.1f} GiB), more than this machine's {:.1f} GiB of memory", what,
                            bytes, double(bytes) / double(1 << 30), double(physical_memory_bytes()) / double(1 << 30)));
}

}  // namespace limits

std::int64_t checked_numel(const std::vector<std::int64_t>& extents, std::string_view what) {
  if (extents.size() > limits::kMaxRank)
    throw Error(fmt::format("{} has rank {}, more than the limit of {}", what, extents.size(), limits::kMaxRank));
  std::int64_t n = 1;
  bool zero = false;
  for (auto e : extents) {
    if (e < 0) throw Error(fmt::format("{} has the negative extent {}", what, e));
    zero = zero || e == 0;
  }
  // A zero extent makes the count 0, but each extent alone must still be in range.
  for (auto e : extents) {
    // One message for "past the limit" and "past int64": both are the same mistake to a user.
    if (e > limits::kMaxElements || (!zero && (__builtin_mul_overflow(n, e, &n) || n > limits::kMaxElements)))
      throw Error(fmt::format("{} holds more than 2^48 elements (the limit on one tensor)", what));
  }
  return zero ? 0 : n;
}

void check_shape(const Shape& shape, std::string_view what) {
  std::vector<std::int64_t> extents;
  extents.reserve(shape.rank());
  for (const auto& d : shape.dims()) {
    if (!d.is_static()) {
      if (d.sym.size() > 256) throw Error(fmt::format("{} has a symbolic dim named with {} bytes", what, d.sym.size()));
      continue;
    }
    extents.push_back(d.size);
  }
  if (shape.rank() > limits::kMaxRank)
    throw Error(fmt::format("{} has rank {}, more than the limit of {}", what, shape.rank(), limits::kMaxRank));
  checked_numel(extents, fmt::format("{} {}", what,
                                     shape.rank() <= 16 ? shape.str() : "of rank " + std::to_string(shape.rank())));
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
    if (da == db || db == one)
      out[i] = da;
    else if (da == one)
      out[i] = db;
    else
      throw Error("shapes " + a.str() + " and " + b.str() + " do not broadcast (dim " + std::to_string(i) + ": " +
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
    acc = limits::checked_mul(acc, extents[i], "strides");
  }
  return s;
}

}  // namespace rlx::ir
