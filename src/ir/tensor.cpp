#include "rlx/ir/tensor.hpp"

#include <cstring>
#include <string>

#include "rlx/error.hpp"
#include "rlx/ir/limits.hpp"
#include "rlx/ir/shape.hpp"

namespace rlx::ir {

namespace {
// Checked before the vector allocates: a huge shape is an rlx::Error, not a
// bad_alloc or 8 GiB zero-filled and then refused.
std::size_t checked_bytes(const std::vector<std::int64_t>& shape, DType dtype) {
  const std::int64_t bytes = checked_numel(shape, "a tensor") * std::int64_t(dtype_size(dtype));
  limits::check_allocation(bytes, "a tensor of " + Shape(shape).str());
  return std::size_t(bytes);
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
  for (std::size_t i = 0; i < values.size(); ++i) t.set(static_cast<std::int64_t>(i), values[i]);
  return t;
}

Tensor Tensor::scalar(DType dtype, double value) {
  Tensor t(dtype, {});
  t.set(0, value);
  return t;
}

std::int64_t Tensor::numel() const { return static_cast<std::int64_t>(data_.size() / dtype_size(dtype_)); }

double Tensor::get(std::int64_t i) const {
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
  }
  return 0;
}

void Tensor::set(std::int64_t i, double v) {
  std::byte* p = data_.data() + static_cast<std::size_t>(i) * dtype_size(dtype_);
  auto store = [p](auto x) { std::memcpy(p, &x, sizeof(x)); };
  double r = round_to_dtype(v, dtype_);
  switch (dtype_) {
    case DType::F32: store(static_cast<float>(r)); break;
    case DType::F64: store(r); break;
    case DType::F16: store(float_to_half(static_cast<float>(v))); break;
    case DType::BF16: store(float_to_bf16(static_cast<float>(v))); break;
    case DType::I8: store(static_cast<std::int8_t>(r)); break;
    case DType::U8: store(static_cast<std::uint8_t>(r)); break;
    case DType::I32: store(static_cast<std::int32_t>(r)); break;
    case DType::I64: store(static_cast<std::int64_t>(r)); break;
    case DType::Bool: store(static_cast<std::uint8_t>(r != 0)); break;
  }
}

std::vector<double> Tensor::to_f64() const {
  std::vector<double> out(static_cast<std::size_t>(numel()));
  for (std::int64_t i = 0; i < numel(); ++i) out[static_cast<std::size_t>(i)] = get(i);
  return out;
}

bool Tensor::operator==(const Tensor& o) const { return dtype_ == o.dtype_ && shape_ == o.shape_ && data_ == o.data_; }

}  // namespace rlx::ir
