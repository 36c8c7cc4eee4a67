#pragma once
// Convolutions through cuDNN (issue 15): a Native conv1d or conv2d kernel (x NCHW, w OIHW, an optional bias
// per out-channel) as one cudnnConvolutionForward, plus cudnnAddTensor for the bias. f32 runs with FMA math
// (exact f32, as PyTorch with TF32 off), or TF32 tensor cores when CompileOptions::tf32 asks; f64 as f64.
// The descriptors and the algorithm (cuDNN's heuristic, as PyTorch without benchmark mode) are made once at
// compile time and shared by clones; each executable has its own handle on its own stream.
#include <memory>
#include <string>

#include "rlx/compile/lir.hpp"

namespace rlx::backends::cuda {

// Whether cuDNN loads here: the backend's traits then keep conv1d and conv2d whole (otherwise the compiler
// decomposes them into matmuls over shifted windows).
bool cudnn_convolutions();

struct ConvPlan;  // opaque outside conv.cpp

// The cuDNN form of kernel `k`, or null with the reason in *why (the kernel then runs on the host).
std::shared_ptr<const ConvPlan> plan_conv(const compile::Kernel& k, bool tf32, std::string* why);
std::size_t conv_workspace_bytes(const ConvPlan& p);
bool conv_has_bias(const ConvPlan& p);

// A cuDNN handle, bound to one stream for its life.
class ConvHandle {
 public:
  ConvHandle() = default;
  explicit ConvHandle(void* stream);  // CUstream
  ~ConvHandle();
  ConvHandle(ConvHandle&& o) noexcept : handle_(o.handle_) { o.handle_ = nullptr; }
  ConvHandle& operator=(ConvHandle&& o) noexcept;
  ConvHandle(const ConvHandle&) = delete;
  ConvHandle& operator=(const ConvHandle&) = delete;
  // Enqueues y = conv(x, w) (+ b) on the handle's stream. Device addresses as integers (CUdeviceptr).
  void enqueue(const ConvPlan& p, unsigned long long x, unsigned long long w, unsigned long long b,
               unsigned long long y, unsigned long long workspace, std::size_t workspace_bytes) const;

 private:
  void* handle_ = nullptr;  // cudnnHandle_t
};

}  // namespace rlx::backends::cuda
