#pragma once
// The CUDA backend ("cuda", Device::Cuda). It registers itself when librlx
// loads. The driver, NVRTC and cuBLASLt are opened with dlopen at run time, so
// librlx has no link-time CUDA dependency: on a machine without an NVIDIA
// driver, make_backend(Device::Cuda) throws with the reason and everything else
// runs. Built without the CUDA headers, the backend registers as unavailable.
// See docs/backends/cuda.md.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/codegen/c.hpp"
#include "rlx/runtime/backend.hpp"
#include "rlx/runtime/calibration.hpp"

namespace rlx::backends::cuda {

std::unique_ptr<runtime::Backend> make_cuda_backend();
// Empty when the backend can run here; otherwise why not.
std::string unavailable_reason();
// What the backend declares to the compile pipeline, with or without a GPU: the
// C target's primitives and dtypes (its kernels are the C target's loop nests in
// CUDA C; f16/bf16 compute in f32), control flow left as host loops.
compile::BackendTraits traits();

struct DeviceInfo {
  int ordinal = 0;
  std::string name;  // "NVIDIA H200"
  std::string arch;  // "sm_90", what NVRTC compiles for
  int multiprocessors = 0;
  int max_shared_bytes = 48 * 1024;  // dynamic shared memory a block may opt in to (227 KiB on the H100)
  std::uint64_t memory_bytes = 0;
  int driver_version = 0;  // 13000 for CUDA 13.0
  // sm_90 and later: a kernel may be launched while the one before it runs (programmatic dependent launch), its
  // generated code waiting at entry for that kernel's end (codegen::c::kCudaGridDependencyWait).
  bool programmatic_launch = false;
};
DeviceInfo selected_device();  // throws rlx::Error when unavailable

// Device-to-device copy bandwidth (cuMemcpyDtoDAsync of `bytes` between two
// allocations, timed with events, best of `reps`), counting bytes read plus
// written, in GB/s: the device's practical memory ceiling.
double copy_bandwidth_gbps(std::uint64_t bytes, int reps = 10);

// The cost model's figures for this GPU (the backend's Backend::calibrate, cached by runtime::calibration_for in
// <cache>/cuda-calib-<device>.json): RLX's f32 GEMM at 4096^3 and a 1 GiB device copy, both timed on the device,
// and the median wall time of a one-element graph's run, host I/O included. About a second.
runtime::Calibration measure_device(runtime::Backend& backend);

// Compiles CUDA C with NVRTC for `arch` (as the backend does, through its
// cubin cache) and returns the cubin's size. Needs NVRTC, not a GPU: the tests
// compile every generated kernel on machines without one.
std::size_t compile_for_arch(const std::string& source, const std::string& arch);
// Empty when NVRTC can be loaded; otherwise why not.
std::string nvrtc_unavailable_reason();
// Compiles the raw kernel registered for custom op `op_name` (runtime::register_cuda_kernel) with NVRTC for
// `arch`, as compile_lir does, and returns the code (PTX for a "compute_XX" arch, a cubin for "sm_XX"). Throws
// rlx::Error naming the op, with NVRTC's log, for source that does not compile, and when no kernel is registered.
// Needs NVRTC, not a GPU.
std::string compile_custom_kernel(std::string_view op_name, const std::string& arch);

// The bytes per thread and step of the generated kernels' vector accesses: RLX_CUDA_VECTOR_BYTES (0 or 16; 16
// when unset). Throws rlx::Error for another value.
std::int64_t vector_bytes();
// The grid steps a vector phase's loop is unrolled by: RLX_CUDA_VECTOR_UNROLL (0 to 8, 0 the compiler's choice;
// 1 when unset). Throws rlx::Error for another value.
std::int64_t vector_unroll();
// The most thread blocks per multiprocessor a grid-stride phase is launched with: RLX_CUDA_BLOCKS_PER_SM (1 to
// 1024; 0, the default, is no limit: a grid covering every iteration once). Throws rlx::Error for another value.
std::int64_t blocks_per_sm();
// The CUDA C the backend generates for `lir` (compiled for traits()): codegen::c::emit_cuda with each buffer's
// alignment as compile_lir lays the buffers out in device memory, and `bytes` per vector access. Needs no GPU.
codegen::c::CudaModule emit(const compile::LirModule& lir, std::int64_t bytes = vector_bytes());

}  // namespace rlx::backends::cuda
