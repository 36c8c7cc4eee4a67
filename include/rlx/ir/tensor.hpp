#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "rlx/ir/dtype.hpp"

namespace rlx::ir {

// A host tensor: dtype, static extents and row-major bytes. A value type.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, std::vector<std::int64_t> shape);  // zero-filled
  Tensor(DType dtype, std::vector<std::int64_t> shape, std::span<const std::byte> bytes);
  static Tensor from_f32(std::vector<std::int64_t> shape, std::span<const float> values);
  static Tensor from_f64(DType dtype, std::vector<std::int64_t> shape, std::span<const double> values);
  static Tensor scalar(DType dtype, double value);

  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t numel() const;
  std::size_t nbytes() const { return data_.size(); }
  std::byte* data() { return data_.data(); }
  const std::byte* data() const { return data_.data(); }
  template <class T>
  T* data_as() {
    return reinterpret_cast<T*>(data_.data());
  }
  template <class T>
  const T* data_as() const {
    return reinterpret_cast<const T*>(data_.data());
  }
  // Element i converted to double (any dtype); and back, with rounding.
  double get(std::int64_t i) const;
  void set(std::int64_t i, double v);
  std::vector<double> to_f64() const;
  bool operator==(const Tensor& o) const;

 private:
  DType dtype_ = DType::F32;
  std::vector<std::int64_t> shape_;
  std::vector<std::byte> data_;
};

// One element of `dtype` at `p`: `v` rounded as the dtype rounds it (round_to_dtype) and encoded, as
// Tensor::set stores it. Block types are left untouched (their elements quantize together).
void write_element(std::byte* p, DType dtype, double v);

// Non-owning views used for I/O across the Session API.
struct TensorView {
  DType dtype = DType::F32;
  std::span<const std::int64_t> shape;
  const void* data = nullptr;
  std::size_t nbytes = 0;
};

// The same, writable: where a kernel puts its result.
struct MutableTensorView {
  DType dtype = DType::F32;
  std::span<const std::int64_t> shape;
  void* data = nullptr;
  std::size_t nbytes = 0;
};

inline TensorView view(const Tensor& t) { return {t.dtype(), t.shape(), t.data(), t.nbytes()}; }

}  // namespace rlx::ir
