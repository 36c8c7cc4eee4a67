#pragma once
// Conversions shared by the _pyrlx binding files: shapes, numpy arrays and
// tensors. Header-only; every function is inline.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstring>
#include <vector>

#include "rlx/error.hpp"
#include "rlx/ir/graph.hpp"
#include "rlx/ir/limits.hpp"

namespace pyrlx {

namespace nb = nanobind;
namespace ir = rlx::ir;

using AnyArray = nb::ndarray<nb::c_contig, nb::device::cpu>;

// A Python int as int64, or rlx::Error naming `what` (nanobind's own failure is a bare std::bad_cast).
inline std::int64_t to_int64(nb::handle v, const std::string& what) {
  if (!PyLong_Check(v.ptr()) || PyBool_Check(v.ptr()))
    throw rlx::Error(what + " must be an int, got " + std::string(nb::str(nb::handle(v.type())).c_str()));
  int overflow = 0;
  long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  if (overflow) throw rlx::Error(what + " " + std::string(nb::str(v).c_str()) + " does not fit in int64");
  return x;
}

// A shape from a sequence (tuple, list) of ints (extents) and strs (symbols). A str
// itself is refused: iterating "banana" would give six symbolic dims.
inline ir::Shape to_shape(nb::handle h) {
  if (nb::isinstance<nb::str>(h) || nb::isinstance<nb::bytes>(h) || !PySequence_Check(h.ptr()))
    throw rlx::Error("a shape must be a tuple or list of ints and symbol names, got " +
                     std::string(nb::str(nb::handle(h.type())).c_str()));
  std::vector<ir::Dim> dims;
  for (auto d : h) {
    if (dims.size() == ir::limits::kMaxRank)
      throw rlx::Error("a shape has more than " + std::to_string(ir::limits::kMaxRank) + " dims");
    if (nb::isinstance<nb::str>(d))
      dims.push_back(ir::Dim::symbol(nb::cast<std::string>(d)));
    else
      dims.emplace_back(to_int64(d, "dim " + std::to_string(dims.size())));
  }
  ir::Shape s(std::move(dims));
  ir::check_shape(s, "shape");
  return s;
}

inline nb::tuple shape_tuple(const ir::Shape& s) {
  nb::list l;
  for (const auto& d : s.dims()) {
    if (d.is_static())
      l.append(d.size);
    else
      l.append(d.sym);
  }
  return nb::tuple(l);
}

inline std::vector<std::int64_t> array_shape(const AnyArray& a) {
  std::vector<std::int64_t> s(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) s[i] = static_cast<std::int64_t>(a.shape(i));
  return s;
}

inline ir::TensorView array_view(const AnyArray& a, ir::DType dtype, std::vector<std::int64_t>& shape_storage) {
  shape_storage = array_shape(a);
  return {dtype, shape_storage, a.data(), a.nbytes()};
}

// Output arrays: numpy owns the memory; bf16 comes back as uint16 and the
// Python layer views it as ml_dtypes.bfloat16 when that is installed.
inline nb::dlpack::dtype dl_dtype(ir::DType t) {
  switch (t) {
    case ir::DType::F32: return nb::dtype<float>();
    case ir::DType::F64: return nb::dtype<double>();
    case ir::DType::F16: return {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case ir::DType::BF16: return nb::dtype<std::uint16_t>();
    case ir::DType::I8: return nb::dtype<std::int8_t>();
    case ir::DType::U8: return nb::dtype<std::uint8_t>();
    case ir::DType::I32: return nb::dtype<std::int32_t>();
    case ir::DType::I64: return nb::dtype<std::int64_t>();
    case ir::DType::Bool: return nb::dtype<bool>();
    case ir::DType::I16: return nb::dtype<std::int16_t>();
    case ir::DType::U16: return nb::dtype<std::uint16_t>();
    case ir::DType::U32: return nb::dtype<std::uint32_t>();
    case ir::DType::U64: return nb::dtype<std::uint64_t>();
    default: break;
  }
  // The storage-only types come back as their bytes (uint8); the Python layer views them as ml_dtypes' types.
  if (ir::is_storage_only(t)) return nb::dtype<std::uint8_t>();
  return nb::dtype<float>();
}

inline nb::object new_array(ir::DType dtype, const std::vector<std::int64_t>& shape, std::byte** data) {
  std::size_t n = ir::dtype_size(dtype);
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  auto* buf = new std::byte[std::max<std::size_t>(n, 1)];
  *data = buf;
  nb::capsule owner(buf, [](void* p) noexcept { delete[] static_cast<std::byte*>(p); });
  std::vector<std::size_t> ushape(shape.begin(), shape.end());
  return nb::cast(nb::ndarray<nb::numpy>(buf, ushape.size(), ushape.data(), owner, nullptr, dl_dtype(dtype)));
}

inline nb::object tensor_to_array(const ir::Tensor& t) {
  std::byte* data = nullptr;
  auto arr = new_array(t.dtype(), t.shape(), &data);
  if (t.nbytes()) std::memcpy(data, t.data(), t.nbytes());
  return arr;
}

inline ir::Tensor array_to_tensor(const AnyArray& a, ir::DType dtype) {
  return ir::Tensor(dtype, array_shape(a), std::span(static_cast<const std::byte*>(a.data()), a.nbytes()));
}

}  // namespace pyrlx
