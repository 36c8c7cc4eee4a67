#pragma once
// Compiled CPU kernels: one object per LIR kernel, built at compile time with
// every plan precomputed; run() only reads the pointer table and scratch.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/isa.hpp"
#include "backends/cpu/program.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "rlx/compile/lir.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/error.hpp"

namespace rlx::backends::cpu {

using i64 = std::int64_t;

// What a kernel sees at run time. Scratch is owned by the executable (so that
// clones run concurrently) and shared by its kernels, which run one at a time.
struct RunCtx {
  std::byte* const* ptrs = nullptr;  // ptrs[buffer id]: resolved buffer addresses
  std::byte* shared = nullptr;       // the kernel's shared scratch
  std::byte* threads = nullptr;      // per-thread scratch, `stride` bytes per slot
  std::size_t stride = 0;
  int max_threads = 1;
  const KernelTable* isa = nullptr;
  std::byte* thread_scratch() const { return threads + std::size_t(ThreadPool::slot()) * stride; }
};

// Buffer `b` of a run as an array of T.
template <class T>
const T* at(const RunCtx& c, compile::BufferId b) {
  return reinterpret_cast<const T*>(c.ptrs[b]);
}
template <class T>
T* at_mut(const RunCtx& c, compile::BufferId b) {
  return reinterpret_cast<T*>(c.ptrs[b]);
}

class CpuKernel {
 public:
  virtual ~CpuKernel() = default;
  virtual void run(const RunCtx& ctx) const = 0;
  // How the kernel runs where it has a choice (the matmul's GEMM path and work split), for tests; empty elsewhere.
  virtual std::string strategy() const { return {}; }
  std::size_t shared_bytes = 0;  // scratch needs, set by the builders
  std::size_t thread_bytes = 0;
};

// Reads index element i of an integer buffer, wraps a negative index once
// (Python style) and range-checks it.
struct IndexReader {
  ir::DType dtype = ir::DType::I64;
  std::string where;
  i64 raw(const std::byte* p, i64 i) const {
    switch (dtype) {
      case ir::DType::I8: return reinterpret_cast<const std::int8_t*>(p)[i];
      case ir::DType::U8: return reinterpret_cast<const std::uint8_t*>(p)[i];
      case ir::DType::I32: return reinterpret_cast<const std::int32_t*>(p)[i];
      case ir::DType::I16: return reinterpret_cast<const std::int16_t*>(p)[i];
      case ir::DType::U16: return reinterpret_cast<const std::uint16_t*>(p)[i];
      case ir::DType::U32: return reinterpret_cast<const std::uint32_t*>(p)[i];
      default: return reinterpret_cast<const std::int64_t*>(p)[i];  // i64, and u64 (past 2^63: out of range)
    }
  }
  i64 operator()(const std::byte* p, i64 i, i64 extent, std::size_t axis) const {
    i64 v = raw(p, i), w = v < 0 ? v + extent : v;
    if (w < 0 || w >= extent)
      throw Error(where + ": index " + std::to_string(v) + " out of range for extent " + std::to_string(extent) +
                  " on axis " + std::to_string(axis));
    return w;
  }
};

struct PackRegistry;

struct BuildCtx {
  const compile::LirModule& lir;
  const compile::Kernel& kernel;
  int threads = 1;
  std::int64_t stream_bytes = 0;  // outputs at least this large use non-temporal stores
  PackRegistry* packs = nullptr;  // constant operands to pack (gemm_pack.hpp); null: none

  const compile::Buffer& in(std::size_t i) const { return lir.buffer(kernel.inputs.at(i)); }
  const compile::Buffer& out(std::size_t i = 0) const { return lir.buffer(kernel.outputs.at(i)); }
  // "cpu kernel 'k3_reduce: ...'": the prefix of every error about this kernel.
  std::string where() const { return "cpu kernel '" + kernel.name + "'"; }
  [[noreturn]] void fail(const std::string& msg) const;
  // Binds every body Input the program needs to its kernel input buffer.
  void bind_inputs(ProgramBuilder& b) const;
  // The kernel input buffer behind body node `id`, which must be a body Input.
  const compile::Buffer& in_of(ir::NodeId id) const;
  // The body's one non-elementwise node (reduce, matmul, movement, native, leaf op).
  const ir::Node& anchor() const;
};

std::int64_t numel(const std::vector<std::int64_t>& shape);

std::unique_ptr<CpuKernel> build_elementwise(const BuildCtx& b);
std::unique_ptr<CpuKernel> build_reduce(const BuildCtx& b);
std::unique_ptr<CpuKernel> build_matmul(const BuildCtx& b);
std::unique_ptr<CpuKernel> build_movement(const BuildCtx& b);
std::unique_ptr<CpuKernel> build_native(const BuildCtx& b);
std::unique_ptr<CpuKernel> build_dynamic_update_slice(const BuildCtx& b);  // kernel_movement.cpp
std::unique_ptr<CpuKernel> build_backward(const BuildCtx& b);              // the backward ops (kernel_backward.cpp)
// quantized_matmul, embedding, dequantize and quantize (kernel_quant.cpp)
std::unique_ptr<CpuKernel> build_quant(const BuildCtx& b);
std::unique_ptr<CpuKernel> build_leaf(const BuildCtx& b);
std::unique_ptr<CpuKernel> build_custom(const BuildCtx& b);  // custom ops with a host kernel
// scan / if / while as host loops over nested executables of this backend (kernel_control.cpp)
std::unique_ptr<CpuKernel> build_control_flow(const BuildCtx& b, const compile::CompileOptions& options);

// Grain (in elements) that amortizes a parallel task's overhead.
inline constexpr std::int64_t kGrain = 16 * kBlock;

}  // namespace rlx::backends::cpu
