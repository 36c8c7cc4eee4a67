#include "rlx/ir/f64_value.hpp"

#include <algorithm>

#include "rlx/error.hpp"
#include "rlx/ir/limits.hpp"

namespace rlx::ir {

std::int64_t numel(const Extents& e) { return checked_numel(e, "a reference value"); }

F64Value::F64Value(DType d, Extents e) : dtype(d), ext(std::move(e)) {
  const std::int64_t n = numel(ext);
  limits::check_allocation(n * 8, "a float64 reference value");
  v.assign(std::size_t(n), 0.0);
}

std::string extents_str(const Extents& e) {
  std::string s = "[";
  for (std::size_t i = 0; i < e.size(); ++i) s += (i ? "," : "") + std::to_string(e[i]);
  return s + "]";
}

void ReferenceArgs::fail(const std::string& msg) const { throw Error(msg); }

std::int64_t ReferenceArgs::axis(std::int64_t a, std::size_t rank) const {
  const auto r = std::int64_t(rank);
  if (a < -r || a >= r) fail("axis " + std::to_string(a) + " out of range for rank " + std::to_string(rank));
  return a < 0 ? a + r : a;
}

Extents ReferenceArgs::declared() const {
  if (!n.shape.is_static()) fail("declared shape " + n.shape.str() + " is not static");
  return n.shape.extents();
}

Extents ReferenceArgs::ints_n(std::string_view key, const Extents& dflt) const {
  const std::size_t count = dflt.size();
  auto it = attrs().items().find(key);
  if (it == attrs().items().end()) return dflt;
  if (const auto* i = std::get_if<std::int64_t>(&it->second)) return Extents(count, *i);
  const auto& v = attrs().get_ints(key);
  if (v.empty()) return dflt;
  if (v.size() == 1) return Extents(count, v[0]);
  if (v.size() != count) fail("attribute '" + std::string(key) + "' needs 1 or " + std::to_string(count) + " entries");
  return v;
}

std::int64_t ReferenceArgs::index(double raw, std::int64_t extent) const {
  auto i = std::int64_t(raw);
  if (i < 0) i += extent;
  if (i < 0 || i >= extent)
    fail("index " + std::to_string(std::int64_t(raw)) + " out of range for extent " + std::to_string(extent));
  return i;
}

Extents broadcast_extents(const ReferenceArgs& c, const Extents& a, const Extents& b) {
  const std::size_t r = std::max(a.size(), b.size());
  Extents out(r);
  for (std::size_t i = 0; i < r; ++i) {
    const std::int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const std::int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1) c.fail("cannot broadcast " + extents_str(a) + " with " + extents_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<std::int64_t> strided_map(const Extents& out, const Extents& strides, std::int64_t base) {
  std::vector<std::int64_t> m(std::size_t(numel(out)));
  Extents idx(out.size(), 0);
  std::int64_t off = base;
  for (auto& slot : m) {
    slot = off;
    for (std::size_t d = out.size(); d-- > 0;) {
      off += strides[d];
      if (++idx[d] < out[d]) break;
      off -= strides[d] * out[d];
      idx[d] = 0;
    }
  }
  return m;
}

std::vector<std::int64_t> broadcast_map(const ReferenceArgs& c, const Extents& in, const Extents& out) {
  if (in.size() > out.size()) c.fail("cannot broadcast " + extents_str(in) + " to " + extents_str(out));
  const auto cs = contiguous_strides(in);
  Extents s(out.size(), 0);
  const std::size_t lead = out.size() - in.size();
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] == out[lead + i])
      s[lead + i] = cs[i];
    else if (in[i] != 1)
      c.fail("cannot broadcast " + extents_str(in) + " to " + extents_str(out));
  }
  return strided_map(out, s);
}

}  // namespace rlx::ir
