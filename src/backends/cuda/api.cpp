#ifdef RLX_HAVE_CUDA
#include "backends/cuda/api.hpp"

#include <fmt/format.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "rlx/error.hpp"
#include "rlx/runtime/calibration.hpp"
#include "rlx/runtime/code_cache.hpp"

namespace rlx::backends::cuda {

namespace {

using runtime::load_symbol;
#define RLX_LOAD(obj, name) load_symbol((obj).lib, (obj).name, RLX_CUDA_STR(name), missing)

template <class T, class Load>
const T& load_once(Load load) {
  return runtime::load_once<T>("cuda", load);
}

std::string open(Library& lib, std::initializer_list<const char*> names, std::string_view what) {
  return runtime::open_library(lib, names, what);
}

}  // namespace

const Driver& Driver::get() {
  return load_once<Driver>([](Driver& d) -> std::string {
    if (auto why = open(d.lib, {"libcuda.so.1", "libcuda.so"}, "no NVIDIA driver: libcuda.so.1 could not be loaded");
        !why.empty())
      return why;
    std::string missing;
    RLX_LOAD(d, cuInit);
    RLX_LOAD(d, cuDriverGetVersion);
    RLX_LOAD(d, cuGetErrorName);
    RLX_LOAD(d, cuGetErrorString);
    RLX_LOAD(d, cuDeviceGetCount);
    RLX_LOAD(d, cuDeviceGet);
    RLX_LOAD(d, cuDeviceGetName);
    RLX_LOAD(d, cuDeviceGetAttribute);
    RLX_LOAD(d, cuDeviceTotalMem);
    RLX_LOAD(d, cuDevicePrimaryCtxRetain);
    RLX_LOAD(d, cuDevicePrimaryCtxRelease);
    RLX_LOAD(d, cuCtxSetCurrent);
    RLX_LOAD(d, cuCtxSynchronize);
    RLX_LOAD(d, cuMemAlloc);
    RLX_LOAD(d, cuMemFree);
    RLX_LOAD(d, cuMemAllocHost);
    RLX_LOAD(d, cuMemFreeHost);
    RLX_LOAD(d, cuMemcpyHtoD);
    RLX_LOAD(d, cuMemcpyDtoH);
    RLX_LOAD(d, cuMemcpyHtoDAsync);
    RLX_LOAD(d, cuMemcpyDtoHAsync);
    RLX_LOAD(d, cuMemcpyDtoDAsync);
    RLX_LOAD(d, cuMemsetD8Async);
    RLX_LOAD(d, cuStreamCreate);
    RLX_LOAD(d, cuStreamDestroy);
    RLX_LOAD(d, cuStreamSynchronize);
    RLX_LOAD(d, cuStreamBeginCapture);
    RLX_LOAD(d, cuStreamEndCapture);
    RLX_LOAD(d, cuGraphInstantiateWithFlags);
    RLX_LOAD(d, cuGraphLaunch);
    RLX_LOAD(d, cuGraphExecDestroy);
    RLX_LOAD(d, cuGraphDestroy);
    RLX_LOAD(d, cuEventCreate);
    RLX_LOAD(d, cuEventDestroy);
    RLX_LOAD(d, cuEventRecord);
    RLX_LOAD(d, cuEventRecordWithFlags);
    RLX_LOAD(d, cuEventSynchronize);
    RLX_LOAD(d, cuEventElapsedTime);
    RLX_LOAD(d, cuModuleLoadData);
    RLX_LOAD(d, cuModuleUnload);
    RLX_LOAD(d, cuModuleGetFunction);
    RLX_LOAD(d, cuFuncSetAttribute);
    RLX_LOAD(d, cuLaunchKernel);
    RLX_LOAD(d, cuLaunchKernelEx);
    if (!missing.empty())
      return fmt::format("the NVIDIA driver ({}) lacks {}: it is older than CUDA 12", d.lib.name(), missing);
    if (CUresult r = d.cuInit(0); r != CUDA_SUCCESS) {
      const char* name = nullptr;
      d.cuGetErrorName(r, &name);
      return fmt::format("cuInit failed: {} (no usable NVIDIA GPU)", name ? name : "unknown error");
    }
    d.cuDriverGetVersion(&d.version);
    int count = 0;
    if (d.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) return "the NVIDIA driver reports no GPU";
    return {};
  });
}

void Driver::check(CUresult r, std::string_view what) const {
  if (r == CUDA_SUCCESS) return;
  const char *name = nullptr, *desc = nullptr;
  cuGetErrorName(r, &name);
  cuGetErrorString(r, &desc);
  throw Error(fmt::format("cuda: {}: {} ({})", what, name ? name : "unknown error", desc ? desc : "no description"));
}

const Nvrtc& Nvrtc::get() {
  return load_once<Nvrtc>([](Nvrtc& n) -> std::string {
    // The toolkit's own folder after the loader's search path: a toolkit under /usr/local/cuda is often not in
    // ld.so.conf.
    if (auto why = open(n.lib,
                        {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", "/usr/local/cuda/lib64/libnvrtc.so.13",
                         "/usr/local/cuda/lib64/libnvrtc.so"},
                        "NVRTC could not be loaded; install the CUDA toolkit or the nvidia-cuda-nvrtc wheel");
        !why.empty())
      return why;
    std::string missing;
    RLX_LOAD(n, nvrtcVersion);
    RLX_LOAD(n, nvrtcGetErrorString);
    RLX_LOAD(n, nvrtcCreateProgram);
    RLX_LOAD(n, nvrtcDestroyProgram);
    RLX_LOAD(n, nvrtcCompileProgram);
    RLX_LOAD(n, nvrtcGetProgramLogSize);
    RLX_LOAD(n, nvrtcGetProgramLog);
    RLX_LOAD(n, nvrtcGetCUBINSize);
    RLX_LOAD(n, nvrtcGetCUBIN);
    RLX_LOAD(n, nvrtcGetPTXSize);
    RLX_LOAD(n, nvrtcGetPTX);
    if (!missing.empty()) return fmt::format("NVRTC ({}) lacks {}", n.lib.name(), missing);
    n.nvrtcVersion(&n.major, &n.minor);
    return {};
  });
}

const BlasLt& BlasLt::get() {
  return load_once<BlasLt>([](BlasLt& b) -> std::string {
    if (auto why = open(b.lib,
                        {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so",
                         "/usr/local/cuda/lib64/libcublasLt.so.13", "/usr/local/cuda/lib64/libcublasLt.so"},
                        "cuBLASLt could not be loaded");
        !why.empty())
      return why;
    std::string missing;
    RLX_LOAD(b, cublasLtCreate);
    RLX_LOAD(b, cublasLtDestroy);
    RLX_LOAD(b, cublasLtMatmulDescCreate);
    RLX_LOAD(b, cublasLtMatmulDescDestroy);
    RLX_LOAD(b, cublasLtMatmulDescSetAttribute);
    RLX_LOAD(b, cublasLtMatrixLayoutCreate);
    RLX_LOAD(b, cublasLtMatrixLayoutDestroy);
    RLX_LOAD(b, cublasLtMatrixLayoutSetAttribute);
    RLX_LOAD(b, cublasLtMatmulPreferenceCreate);
    RLX_LOAD(b, cublasLtMatmulPreferenceDestroy);
    RLX_LOAD(b, cublasLtMatmulPreferenceSetAttribute);
    RLX_LOAD(b, cublasLtMatmulAlgoGetHeuristic);
    RLX_LOAD(b, cublasLtMatmul);
    return missing.empty() ? std::string() : fmt::format("cuBLASLt ({}) lacks {}", b.lib.name(), missing);
  });
}

void BlasLt::check(cublasStatus_t s, std::string_view what) const {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(fmt::format("cuda: cuBLASLt {}: status {}", what, int(s)));
}

#ifdef RLX_HAVE_CUDNN
const Cudnn& Cudnn::get() {
  return load_once<Cudnn>([](Cudnn& c) -> std::string {
    if (auto why = open(c.lib, {"libcudnn.so.9", "libcudnn.so", "/usr/local/cuda/lib64/libcudnn.so.9"},
                        "cuDNN could not be loaded (convolutions run as matmuls)");
        !why.empty())
      return why;
    std::string missing;
    RLX_LOAD(c, cudnnGetVersion);
    RLX_LOAD(c, cudnnGetErrorString);
    RLX_LOAD(c, cudnnCreate);
    RLX_LOAD(c, cudnnDestroy);
    RLX_LOAD(c, cudnnSetStream);
    RLX_LOAD(c, cudnnCreateTensorDescriptor);
    RLX_LOAD(c, cudnnDestroyTensorDescriptor);
    RLX_LOAD(c, cudnnSetTensor4dDescriptor);
    RLX_LOAD(c, cudnnCreateFilterDescriptor);
    RLX_LOAD(c, cudnnDestroyFilterDescriptor);
    RLX_LOAD(c, cudnnSetFilter4dDescriptor);
    RLX_LOAD(c, cudnnCreateConvolutionDescriptor);
    RLX_LOAD(c, cudnnDestroyConvolutionDescriptor);
    RLX_LOAD(c, cudnnSetConvolution2dDescriptor);
    RLX_LOAD(c, cudnnSetConvolutionGroupCount);
    RLX_LOAD(c, cudnnSetConvolutionMathType);
    RLX_LOAD(c, cudnnGetConvolution2dForwardOutputDim);
    RLX_LOAD(c, cudnnGetConvolutionForwardAlgorithm_v7);
    RLX_LOAD(c, cudnnGetConvolutionForwardWorkspaceSize);
    RLX_LOAD(c, cudnnConvolutionForward);
    RLX_LOAD(c, cudnnAddTensor);
    if (!missing.empty()) return fmt::format("cuDNN ({}) lacks {}", c.lib.name(), missing);
    c.version = c.cudnnGetVersion();
    if (c.version < 90000) return fmt::format("cuDNN ({}) is version {}; RLX needs 9", c.lib.name(), c.version);
    return {};
  });
}

void Cudnn::check(cudnnStatus_t s, std::string_view what) const {
  if (s != CUDNN_STATUS_SUCCESS) throw Error(fmt::format("cuda: cuDNN {}: {}", what, cudnnGetErrorString(s)));
}
#endif

#undef RLX_LOAD

// ---- the cubin cache ------------------------------------------------------------

namespace {

struct MemoryCache {
  std::mutex mu;
  std::unordered_map<std::string, std::string> map;
};
MemoryCache& memory_cache() {
  static auto* c = new MemoryCache;
  return *c;
}

// A cubin (an ELF file) or PTX from the disk cache; anything else (a torn write from another process) is
// compiled again.
std::string read_code(const std::filesystem::path& p) {
  std::string s = runtime::read_code_file(p);
  const bool elf = s.size() >= 4 && s.compare(0, 4,
                                              "\x7f"
                                              "ELF") == 0;
  return elf || s.find(".target") != std::string::npos ? s : std::string();
}

}  // namespace

std::string compile_cubin(const std::string& source, const std::string& arch, std::string_view what) {
  const Nvrtc& nv = Nvrtc::get();
  const std::string keyed = fmt::format("rlx-cubin-2|nvrtc {}.{}|{}|", nv.major, nv.minor, arch) + source;
  const std::string key = runtime::code_key(keyed);
  auto& mc = memory_cache();
  {
    std::lock_guard lock(mc.mu);
    if (auto it = mc.map.find(key); it != mc.map.end()) return it->second;
  }
  std::filesystem::path file;
  if (auto root = runtime::cache_dir(); !root.empty()) file = root / "cuda-cubin" / (key + ".cubin");
  std::string cubin = file.empty() ? std::string() : read_code(file);
  if (cubin.empty()) {
    nvrtcProgram prog = nullptr;
    if (nvrtcResult r = nv.nvrtcCreateProgram(&prog, source.c_str(), "rlx_kernel.cu", 0, nullptr, nullptr);
        r != NVRTC_SUCCESS)
      throw Error(fmt::format("cuda: NVRTC could not create a program for {}: {}", what, nv.nvrtcGetErrorString(r)));
    const std::string arch_opt = "--gpu-architecture=" + arch;
    // -minimal: none of NVRTC's implicit CUDA headers (the generated code needs only built-ins), a few
    // milliseconds less per program.
    const char* opts[] = {arch_opt.c_str(), "--std=c++17", "--extra-device-vectorization", "-minimal"};
    nvrtcResult r = nv.nvrtcCompileProgram(prog, int(std::size(opts)), opts);
    std::size_t log_size = 0;
    nv.nvrtcGetProgramLogSize(prog, &log_size);
    std::string log(log_size, '\0');
    if (log_size) nv.nvrtcGetProgramLog(prog, log.data());
    if (r == NVRTC_SUCCESS) {
      std::size_t n = 0;
      if (arch.starts_with("compute_")) {
        nv.nvrtcGetPTXSize(prog, &n);
        cubin.resize(n);
        nv.nvrtcGetPTX(prog, cubin.data());
      } else {
        nv.nvrtcGetCUBINSize(prog, &n);
        cubin.resize(n);
        nv.nvrtcGetCUBIN(prog, cubin.data());
      }
    }
    nv.nvrtcDestroyProgram(&prog);
    if (r != NVRTC_SUCCESS)
      throw Error(fmt::format("cuda: NVRTC failed to compile {} for {}: {}\n{}\n--- source ---\n{}", what, arch,
                              nv.nvrtcGetErrorString(r), log, source));
    if (!file.empty()) runtime::write_code_file(file, cubin);
  }
  std::lock_guard lock(mc.mu);
  mc.map.emplace(key, cubin);
  return cubin;
}

}  // namespace rlx::backends::cuda
#endif
