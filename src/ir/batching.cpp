#include "rlx/ir/batching.hpp"

#include <algorithm>

#include "rlx/error.hpp"

namespace rlx::ir {

Shape prepend(Dim d, const Shape& s) {
  std::vector<Dim> dims = s.dims();
  dims.insert(dims.begin(), std::move(d));
  return Shape(std::move(dims));
}

Attrs with_attr(const Node& n, const std::string& key, AttrValue v) {
  Attrs a = n.attrs;
  a.set(key, std::move(v));
  return a;
}

std::vector<std::int64_t> shifted_axes(const std::vector<std::int64_t>& axes, std::size_t rank) {
  std::vector<std::int64_t> out;
  for (auto a : axes) out.push_back(normalize_axis(a, rank) + 1);
  return out;
}

NodeId lift(Graph& g, const BatchedValue& v, const Shape& s, const Dim& size) {
  if (v.batched) return v.id;
  return g.expand(g.reshape(v.id, prepend(Dim(1), s)), prepend(size, s));
}

NodeId align(Graph& g, NodeId id, std::size_t rank, std::size_t to) {
  if (rank >= to) return id;
  std::vector<Dim> dims(to - rank, Dim(1));
  const Shape& s = g.node(id).shape;
  dims.insert(dims.begin(), s.dims().begin(), s.dims().begin() + 1);
  dims.insert(dims.end(), s.dims().begin() + 1, s.dims().end());
  return g.reshape(id, Shape(std::move(dims)));
}

BatchedValue BatchArgs::declared(OpKind op, std::vector<NodeId> ins, Attrs a) const {
  return out(g.add_declared(op, std::move(ins), std::move(a), n.dtype, prepend(size, n.shape)));
}

bool BatchArgs::only_first_batched() const {
  return std::none_of(x.begin() + 1, x.end(), [](const BatchedValue& v) { return v.batched; });
}

std::vector<NodeId> BatchArgs::ids() const {
  std::vector<NodeId> out;
  for (const BatchedValue& v : x) out.push_back(v.id);
  return out;
}

std::int64_t BatchArgs::static_size(const char* why) const {
  if (!size.is_static()) throw Error("vmap: " + std::string(why) + " needs a static batch size, got " + size.str());
  return size.size;
}

NodeId BatchArgs::merge(NodeId id) const {
  const Shape& s = g.node(id).shape;
  std::vector<Dim> dims(s.dims().begin() + 1, s.dims().end());
  dims[0] = Dim(size.size * dims[0].size);
  return g.reshape(id, Shape(std::move(dims)));
}

NodeId BatchArgs::split(NodeId id) const {
  const Shape& s = g.node(id).shape;
  std::vector<Dim> dims = s.dims();
  dims[0] = Dim(s[0].size / size.size);
  dims.insert(dims.begin(), size);
  return g.reshape(id, Shape(std::move(dims)));
}

}  // namespace rlx::ir
