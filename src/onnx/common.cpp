// TensorProto decoding (with every count, length and external-data offset checked) and the converter
// context's helpers.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "onnx/detail.hpp"
#include "onnx/proto/onnx.pb.h"
#include "rlx/ir/limits.hpp"

namespace rlx::onnx::detail {

std::optional<ir::DType> dtype_of(std::int64_t onnx_type) {
  using T = ::onnx::TensorProto;
  switch (onnx_type) {
    case T::FLOAT: return ir::DType::F32;
    case T::UINT8: return ir::DType::U8;
    case T::INT8: return ir::DType::I8;
    case T::INT32: return ir::DType::I32;
    case T::INT64: return ir::DType::I64;
    case T::BOOL: return ir::DType::Bool;
    case T::FLOAT16: return ir::DType::F16;
    case T::DOUBLE: return ir::DType::F64;
    case T::BFLOAT16: return ir::DType::BF16;
    case T::INT16: return ir::DType::I16;
    case T::UINT16: return ir::DType::U16;
    case T::UINT32: return ir::DType::U32;
    case T::UINT64: return ir::DType::U64;
    case T::FLOAT8E4M3FN: return ir::DType::F8E4M3FN;
    case T::FLOAT8E4M3FNUZ: return ir::DType::F8E4M3FNUZ;
    case T::FLOAT8E5M2: return ir::DType::F8E5M2;
    case T::FLOAT8E5M2FNUZ: return ir::DType::F8E5M2FNUZ;
    case T::FLOAT8E8M0: return ir::DType::F8E8M0;
    case T::FLOAT4E2M1: return ir::DType::F4E2M1;
    case T::INT4: return ir::DType::I4;
    case T::UINT4: return ir::DType::U4;
    case T::INT2: return ir::DType::I2;
    case T::UINT2: return ir::DType::U2;
    default: return std::nullopt;
  }
}

std::string onnx_type_name(std::int64_t onnx_type) {
  if (::onnx::TensorProto_DataType_IsValid(int(onnx_type)))
    return ::onnx::TensorProto_DataType_Name(::onnx::TensorProto_DataType(onnx_type));
  return fmt::format("#{}", onnx_type);
}

namespace {

// Reads [offset, offset + length) of an external data file under base_dir. The location must stay
// inside base_dir (no absolute path, no '..'), as ONNX Runtime requires.
std::vector<std::byte> read_external(const ::onnx::TensorProto& t, const std::string& base_dir, const std::string& what,
                                     std::size_t want) {
  std::string location;
  std::int64_t offset = 0, length = -1;
  auto to_int = [&](const std::string& key, const std::string& s) {
    std::int64_t v = 0;
    std::size_t used = 0;
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != s.size() || s.empty() || v < 0)
      throw Error(fmt::format("onnx: {}: external data field '{}' is not a non-negative integer ('{}')", what, key, s));
    return v;
  };
  for (const auto& kv : t.external_data()) {
    if (kv.key() == "location")
      location = kv.value();
    else if (kv.key() == "offset")
      offset = to_int("offset", kv.value());
    else if (kv.key() == "length")
      length = to_int("length", kv.value());
  }
  if (location.empty()) throw Error(fmt::format("onnx: {}: external data has no location", what));
  const std::filesystem::path rel(location);
  if (rel.is_absolute()) throw Error(fmt::format("onnx: {}: external data location '{}' is absolute", what, location));
  for (const auto& part : rel)
    if (part == "..")
      throw Error(fmt::format("onnx: {}: external data location '{}' leaves the model's folder", what, location));
  if (base_dir.empty())
    throw Error(fmt::format("onnx: {}: external data '{}' needs ImportOptions::base_dir", what, location));
  const auto path = std::filesystem::path(base_dir) / rel;
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec)
    throw Error(fmt::format("onnx: {}: cannot read external data file '{}': {}", what, path.string(), ec.message()));
  if (length >= 0 && std::size_t(length) != want)
    throw Error(fmt::format("onnx: {}: external data length {} is not the tensor's {} bytes", what, length, want));
  if (std::uint64_t(offset) > size || size - std::uint64_t(offset) < want)
    throw Error(fmt::format("onnx: {}: external data [{}, {}+{}) runs past the end of '{}' ({} bytes)", what, offset,
                            offset, want, path.string(), size));
  std::ifstream f(path, std::ios::binary);
  std::vector<std::byte> out(want);
  f.seekg(offset);
  f.read(reinterpret_cast<char*>(out.data()), std::streamsize(want));
  if (!f) throw Error(fmt::format("onnx: {}: reading external data '{}' failed", what, path.string()));
  return out;
}

// Elements per byte of ONNX's packed sub-byte types (low bits first); 1 for every other type.
int packed_per_byte(ir::DType t) {
  switch (t) {
    case ir::DType::I4:
    case ir::DType::U4:
    case ir::DType::F4E2M1: return 2;
    case ir::DType::I2:
    case ir::DType::U2: return 4;
    default: return 1;
  }
}

// ONNX packs 4- and 2-bit elements into bytes, the first element in the low bits; RLX holds one a byte.
ir::Tensor unpacked(ir::DType dt, std::vector<std::int64_t> shape, std::span<const std::uint8_t> packed,
                    std::int64_t n) {
  const int per = packed_per_byte(dt), bits = 8 / per;
  std::vector<std::byte> out(std::size_t(n), std::byte{0});
  for (std::int64_t i = 0; i < n; ++i)
    out[std::size_t(i)] = std::byte((packed[std::size_t(i / per)] >> (bits * (i % per))) & ((1 << bits) - 1));
  return ir::Tensor(dt, std::move(shape), out);
}

}  // namespace

ir::Tensor tensor_from_proto(const ::onnx::TensorProto& t, const std::string& base_dir, const std::string& what) {
  auto dt = dtype_of(t.data_type());
  if (!dt)
    throw Error(
        fmt::format("onnx: {} has element type {}, which RLX has no dtype for", what, onnx_type_name(t.data_type())));
  if (t.has_segment()) throw Error(fmt::format("onnx: {} is segmented, which is not supported", what));
  std::vector<std::int64_t> shape(t.dims().begin(), t.dims().end());
  for (auto d : shape)
    if (d < 0) throw Error(fmt::format("onnx: {} has a negative dim ({})", what, d));
  const std::int64_t n = ir::checked_numel(shape, what);
  const std::size_t esize = ir::dtype_size(*dt);
  const std::size_t want = std::size_t(ir::limits::checked_mul(n, std::int64_t(esize), what));
  ir::limits::check_allocation(std::int64_t(want), what);
  const int per = packed_per_byte(*dt);
  // The bytes the file holds: packed sub-byte elements take a byte per `per` of them.
  const std::size_t file_bytes = per == 1 ? want : (std::size_t(n) + std::size_t(per) - 1) / std::size_t(per);
  auto from_file = [&](std::span<const std::byte> bytes) {
    if (per == 1) return ir::Tensor(*dt, shape, bytes);
    return unpacked(*dt, shape, {reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()}, n);
  };
  if (t.data_location() == ::onnx::TensorProto::EXTERNAL)
    return from_file(read_external(t, base_dir, what, file_bytes));
  if (t.has_raw_data()) {
    const auto& raw = t.raw_data();
    if (raw.size() != file_bytes)
      throw Error(fmt::format("onnx: {} holds {} bytes of raw data, its shape needs {}", what, raw.size(), file_bytes));
    return from_file(std::as_bytes(std::span<const char>(raw.data(), raw.size())));
  }
  ir::Tensor out(*dt, shape);
  auto check_count = [&](std::int64_t have, const char* field) {
    if (have != n) throw Error(fmt::format("onnx: {} has {} values in {}, its shape needs {}", what, have, field, n));
  };
  if (per > 1) {  // int32_data holds one packed byte an entry
    const std::int64_t have = t.int32_data_size();
    if (have != std::int64_t(file_bytes))
      throw Error(
          fmt::format("onnx: {} has {} values in int32_data, its shape needs {} packed bytes", what, have, file_bytes));
    std::vector<std::uint8_t> packed(file_bytes);
    for (std::size_t i = 0; i < file_bytes; ++i) packed[i] = std::uint8_t(t.int32_data(int(i)));
    return unpacked(*dt, shape, packed, n);
  }
  if (ir::is_storage_only(*dt)) {  // float8: one bit pattern an int32_data entry
    check_count(t.int32_data_size(), "int32_data");
    auto* p = out.data_as<std::uint8_t>();
    for (std::int64_t i = 0; i < n; ++i) p[i] = std::uint8_t(t.int32_data(int(i)));
    return out;
  }
  switch (*dt) {
    case ir::DType::F32:
      check_count(t.float_data_size(), "float_data");
      if (n) std::memcpy(out.data(), t.float_data().data(), want);
      break;
    case ir::DType::F64:
      check_count(t.double_data_size(), "double_data");
      if (n) std::memcpy(out.data(), t.double_data().data(), want);
      break;
    case ir::DType::I64:
      check_count(t.int64_data_size(), "int64_data");
      if (n) std::memcpy(out.data(), t.int64_data().data(), want);
      break;
    case ir::DType::I32:
      check_count(t.int32_data_size(), "int32_data");
      if (n) std::memcpy(out.data(), t.int32_data().data(), want);
      break;
    case ir::DType::F16:
    case ir::DType::BF16: {
      // 16-bit floats sit in int32_data, one per entry, as their bit patterns.
      check_count(t.int32_data_size(), "int32_data");
      auto* p = out.data_as<std::uint16_t>();
      for (std::int64_t i = 0; i < n; ++i) p[i] = std::uint16_t(t.int32_data(int(i)));
      break;
    }
    case ir::DType::U32:
    case ir::DType::U64: {
      check_count(t.uint64_data_size(), "uint64_data");
      for (std::int64_t i = 0; i < n; ++i) {
        const std::uint64_t v = t.uint64_data(int(i));
        if (*dt == ir::DType::U32)
          out.data_as<std::uint32_t>()[i] = std::uint32_t(v);
        else
          out.data_as<std::uint64_t>()[i] = v;
      }
      break;
    }
    default: {  // i8 u8 i16 u16 bool: one per int32_data entry
      check_count(t.int32_data_size(), "int32_data");
      for (std::int64_t i = 0; i < n; ++i) out.set(i, double(t.int32_data(int(i))));
      break;
    }
  }
  return out;
}

// ---- Ctx ----

const std::string& Ctx::op_type() const { return node_.op_type(); }
std::size_t Ctx::num_outputs() const { return std::size_t(node_.output_size()); }

std::string Ctx::where() const {
  return fmt::format("onnx: node '{}' ({}, domain {}, opset {})", node_.name(), node_.op_type(), domain_, opset_);
}

void Ctx::fail(const std::string& msg) const { throw Error(where() + ": " + msg); }

NodeId Ctx::in(std::size_t i) const {
  if (!has(i)) fail(fmt::format("input {} is required", i));
  return *inputs_[i];
}

std::vector<std::int64_t> Ctx::shape(std::size_t i) const {
  const ir::Shape& s = g.node(in(i)).shape;
  if (!s.is_static()) {
    std::string names;
    for (const auto& name : ir::shape_symbols(s)) names += (names.empty() ? "" : ", ") + name;
    fail(
        fmt::format("input {} is {}{}: this op needs its static extents; bind {} at import "
                    "(ImportOptions::dims, `--dim NAME=N`)",
                    i, ir::dtype_name(g.node(in(i)).dtype), s.str(), names));
  }
  return s.extents();
}

std::vector<ir::DimExpr> Ctx::dim_ints(std::size_t i, std::string_view what) const {
  if (const SymInts* s = sym(i)) return s->elems;
  auto v = ints(i, what);
  return {v.begin(), v.end()};
}

std::vector<std::int64_t> Ctx::ints(std::size_t i, std::string_view what) const {
  auto v = ints_or(i);
  if (!v)
    fail(
        fmt::format("input {} ({}) must be known at import (a constant, an initializer, or computed from static "
                    "shapes); bind the symbolic dims",
                    i, what));
  return *v;
}

std::optional<std::vector<std::int64_t>> Ctx::ints_or(std::size_t i) const {
  const ir::Tensor* t = value(i);
  if (!t) return std::nullopt;
  std::vector<std::int64_t> out(std::size_t(t->numel()));
  // Through int64 directly: INT64_MAX (ONNX's "to the end") does not survive a trip through double.
  if (t->dtype() == ir::DType::I64) {
    std::copy_n(t->data_as<std::int64_t>(), out.size(), out.begin());
    return out;
  }
  for (std::int64_t k = 0; k < t->numel(); ++k) {
    const double v = t->get(k);
    if (!(std::abs(v) < 9.2e18)) fail(fmt::format("input {} holds {}, which is not an int64", i, v));
    out[std::size_t(k)] = std::int64_t(v);
  }
  return out;
}

double Ctx::scalar(std::size_t i, std::string_view what) const {
  const ir::Tensor* t = value(i);
  if (!t || t->numel() != 1) fail(fmt::format("input {} ({}) must be a one-element value known at import", i, what));
  return t->get(0);
}

const ::onnx::AttributeProto* Ctx::attr(std::string_view name) const {
  for (const auto& a : node_.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

std::int64_t Ctx::attr_int(std::string_view name, std::int64_t def) const {
  const auto* a = attr(name);
  return a ? a->i() : def;
}

std::int64_t Ctx::attr_int(std::string_view name) const {
  const auto* a = attr(name);
  if (!a) fail(fmt::format("attribute '{}' is required", name));
  return a->i();
}

double Ctx::attr_float(std::string_view name, double def) const {
  const auto* a = attr(name);
  return a ? double(a->f()) : def;
}

std::string Ctx::attr_str(std::string_view name, const std::string& def) const {
  const auto* a = attr(name);
  return a ? a->s() : def;
}

std::vector<std::int64_t> Ctx::attr_ints(std::string_view name, std::vector<std::int64_t> def) const {
  const auto* a = attr(name);
  if (!a) return def;
  return {a->ints().begin(), a->ints().end()};
}

std::vector<double> Ctx::attr_floats(std::string_view name) const {
  const auto* a = attr(name);
  if (!a) return {};
  return {a->floats().begin(), a->floats().end()};
}

std::optional<ir::Tensor> Ctx::attr_tensor(std::string_view name) const {
  const auto* a = attr(name);
  if (!a || !a->has_t()) return std::nullopt;
  return tensor_from_proto(a->t(), "", fmt::format("attribute '{}'", name));
}

NodeId Ctx::i64s(const std::vector<std::int64_t>& v) {
  ir::Tensor t(ir::DType::I64, {std::int64_t(v.size())});
  for (std::size_t i = 0; i < v.size(); ++i) t.data_as<std::int64_t>()[i] = v[i];
  return g.constant(t);
}

NodeId dims_value(ir::Graph& g, const std::vector<ir::DimExpr>& dims, const ir::Shape& shape) {
  bool known = true;
  for (const auto& d : dims) known = known && d.constant().has_value();
  if (known) {
    ir::Tensor t(ir::DType::I64, shape.extents());
    for (std::size_t i = 0; i < dims.size(); ++i) t.data_as<std::int64_t>()[i] = *dims[i].constant();
    return g.constant(t);
  }
  std::vector<NodeId> parts;
  for (const auto& d : dims) {
    const NodeId one = g.scalar(1, ir::DType::I64);
    parts.push_back(d.constant() ? g.reshape(g.scalar(double(*d.constant()), ir::DType::I64), ir::Shape{1})
                                 : g.reduce(ir::OpKind::ReduceSum,
                                            g.expand(one, ir::Shape(std::vector<ir::Dim>{d.dim()})), {0}, true));
  }
  const NodeId flat = parts.size() == 1 ? parts[0] : g.concat(parts, 0);
  return g.reshape(flat, shape);
}

NodeId dims_value(Ctx& c, const std::vector<ir::DimExpr>& dims, const ir::Shape& shape) {
  return dims_value(c.g, dims, shape);
}

NodeId cast_to(Ctx& c, NodeId x, ir::DType to) { return c.g.node(x).dtype == to ? x : c.g.cast(x, to); }

std::int64_t axis_of(Ctx& c, std::int64_t axis, std::size_t rank) {
  const auto r = std::int64_t(rank);
  if (axis < -r || axis >= r) c.fail(fmt::format("axis {} is out of range for rank {}", axis, r));
  return axis < 0 ? axis + r : axis;
}

const Table& op_table() {
  static const auto table = [] {
    std::map<std::string, OpEntry, std::less<>> t;
    register_elementwise(t);
    register_tensor(t);
    register_nn(t);
    register_misc(t);
    return t;
  }();
  return table;
}

}  // namespace rlx::onnx::detail
