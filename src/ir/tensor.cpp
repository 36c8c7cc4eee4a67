#include "rlx/ir/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "rlx/error.hpp"
#include "rlx/ir/limits.hpp"
#include "rlx/ir/quants.hpp"
#include "rlx/ir/shape.hpp"

namespace rlx::ir {

namespace {
// Checked before the vector allocates: a huge shape is an rlx::Error, not a
// bad_alloc or 8 GiB zero-filled and then refused.
std::size_t checked_bytes(const std::vector<std::int64_t>& shape, DType dtype) {
  (void)checked_numel(shape, "a tensor");
  const auto bytes = std::int64_t(storage_bytes(dtype, shape));
  limits::check_allocation(bytes, "a tensor of " + Shape(shape).str());
  return std::size_t(bytes);
}

// A block type's elements are its rows' blocks dequantized (rlx/ir/quants.hpp).
std::vector<float> dequantized(const Tensor& t) {
  std::vector<float> out(std::size_t(t.numel()));
  dequantize(t.dtype(), std::span(t.data(), t.nbytes()), out);
  return out;
}
}  // namespace

Tensor::Tensor(DType dtype, std::vector<std::int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)), data_(checked_bytes(shape_, dtype)) {}

Tensor::Tensor(DType dtype, std::vector<std::int64_t> shape, std::span<const std::byte> bytes)
    : Tensor(dtype, std::move(shape)) {
  if (bytes.size() != data_.size())
    throw Error("tensor data has " + std::to_string(bytes.size()) + " bytes, expected " + std::to_string(data_.size()));
  if (!bytes.empty()) std::memcpy(data_.data(), bytes.data(), bytes.size());
}

Tensor Tensor::from_f32(std::vector<std::int64_t> shape, std::span<const float> values) {
  return Tensor(DType::F32, std::move(shape), std::as_bytes(values));
}

Tensor Tensor::from_f64(DType dtype, std::vector<std::int64_t> shape, std::span<const double> values) {
  Tensor t(dtype, std::move(shape));
  if (static_cast<std::int64_t>(values.size()) != t.numel())
    throw Error("tensor has " + std::to_string(t.numel()) + " elements, got " + std::to_string(values.size()) +
                " values");
  if (is_block_quantized(dtype)) {  // the rows quantize together
    std::vector<float> f(values.begin(), values.end());
    quantize(dtype, f, std::span(t.data(), t.nbytes()));
    return t;
  }
  for (std::size_t i = 0; i < values.size(); ++i) t.set(static_cast<std::int64_t>(i), values[i]);
  return t;
}

Tensor Tensor::scalar(DType dtype, double value) {
  Tensor t(dtype, {});
  t.set(0, value);
  return t;
}

std::int64_t Tensor::numel() const {
  // A zero extent first: the others may each be up to 2^48 (checked_numel), so their product can overflow.
  if (std::find(shape_.begin(), shape_.end(), 0) != shape_.end()) return 0;
  std::int64_t n = 1;
  for (std::int64_t d : shape_) n *= d;
  return n;
}

double Tensor::get(std::int64_t i) const {
  if (is_block_quantized(dtype_)) {  // the element's block, dequantized
    const auto [elems, bytes] = block_layout(dtype_);
    std::vector<float> block(elems);
    dequantize(dtype_, std::span(data_.data() + std::size_t(i) / elems * bytes, bytes), block);
    return block[std::size_t(i) % elems];
  }
  const std::byte* p = data_.data() + static_cast<std::size_t>(i) * dtype_size(dtype_);
  auto load = [p]<class T>(T) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  };
  switch (dtype_) {
    case DType::F32: return load(float{});
    case DType::F64: return load(double{});
    case DType::F16: return half_to_float(load(std::uint16_t{}));
    case DType::BF16: return bf16_to_float(load(std::uint16_t{}));
    case DType::I8: return load(std::int8_t{});
    case DType::U8: return load(std::uint8_t{});
    case DType::I32: return load(std::int32_t{});
    case DType::I64: return static_cast<double>(load(std::int64_t{}));
    case DType::Bool: return load(std::uint8_t{}) != 0;
    case DType::I16: return load(std::int16_t{});
    case DType::U16: return load(std::uint16_t{});
    case DType::U32: return load(std::uint32_t{});
    case DType::U64: return static_cast<double>(load(std::uint64_t{}));
    default:
      if (is_storage_only(dtype_)) return storage_decode(dtype_, load(std::uint8_t{}));
      break;  // the block types: above
  }
  return 0;
}

namespace {

// A u64 element: a negative integer wraps exactly through int64 (-5 is 2^64 - 5, which a double rounds to
// 2^64); `r` is round_to_dtype's value for the others, where 2^64 stands for such a wrapped value and keeps its
// nearest, 2^64 - 1.
std::uint64_t to_u64(double v, double r) {
  const double t = std::isfinite(v) ? std::trunc(v) : 0.0;
  if (t < 0 && t >= -9223372036854775808.0) return std::uint64_t(std::int64_t(t));
  return r >= 18446744073709551616.0 ? ~std::uint64_t(0) : static_cast<std::uint64_t>(r);
}

}  // namespace

void write_element(std::byte* p, DType dtype, double v) {
  auto store = [p](auto x) { std::memcpy(p, &x, sizeof(x)); };
  const double r = round_to_dtype(v, dtype);
  switch (dtype) {
    case DType::F32: store(static_cast<float>(r)); break;
    case DType::F64: store(r); break;
    case DType::F16: store(float_to_half(static_cast<float>(v))); break;
    case DType::BF16: store(float_to_bf16(static_cast<float>(v))); break;
    case DType::I8: store(static_cast<std::int8_t>(r)); break;
    case DType::U8: store(static_cast<std::uint8_t>(r)); break;
    case DType::I32: store(static_cast<std::int32_t>(r)); break;
    case DType::I64: store(static_cast<std::int64_t>(r)); break;
    case DType::Bool: store(static_cast<std::uint8_t>(r != 0)); break;
    case DType::I16: store(static_cast<std::int16_t>(r)); break;
    case DType::U16: store(static_cast<std::uint16_t>(r)); break;
    case DType::U32: store(static_cast<std::uint32_t>(r)); break;
    case DType::U64: store(to_u64(v, r)); break;
    default:
      if (is_storage_only(dtype)) store(storage_encode(dtype, r));
      break;  // the block types: nothing (their elements quantize together)
  }
}

void Tensor::set(std::int64_t i, double v) {
  if (is_block_quantized(dtype_))
    throw Error("set element " + std::to_string(i) + " of a " + std::string(dtype_name(dtype_)) +
                " tensor: a block type's elements quantize together (Tensor::from_f64, rlx::ir::quantize)");
  write_element(data_.data() + static_cast<std::size_t>(i) * dtype_size(dtype_), dtype_, v);
}

std::vector<double> Tensor::to_f64() const {
  if (is_block_quantized(dtype_)) {
    const std::vector<float> f = dequantized(*this);
    return {f.begin(), f.end()};
  }
  std::vector<double> out(static_cast<std::size_t>(numel()));
  for (std::int64_t i = 0; i < numel(); ++i) out[static_cast<std::size_t>(i)] = get(i);
  return out;
}

bool Tensor::operator==(const Tensor& o) const { return dtype_ == o.dtype_ && shape_ == o.shape_ && data_ == o.data_; }

}  // namespace rlx::ir
