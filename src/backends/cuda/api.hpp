#pragma once
// The CUDA libraries RLX calls, opened with dlopen at run time, as IREE's
// dynamic_symbols does: no link-time dependency on a CUDA version, and a
// machine without a driver reports the backend unavailable instead of failing
// to load librlx. The toolkit's headers give the types and prototypes; each
// function is looked up by the name its header maps it to (cuMemAlloc is
// cuMemAlloc_v2), so a pointer always has the type the header declares.
#include <cublasLt.h>
#include <cuda.h>
#include <nvrtc.h>
#ifdef RLX_HAVE_CUDNN
#include <cudnn.h>
#endif

#include <initializer_list>
#include <string>
#include <string_view>

#include "rlx/runtime/dynamic_library.hpp"

namespace rlx::backends::cuda {

using runtime::Library;

#define RLX_CUDA_STR2(x) #x
#define RLX_CUDA_STR(x) RLX_CUDA_STR2(x)
#define RLX_CUDA_FN(name) decltype(&::name) name = nullptr

// The driver API (libcuda.so.1, installed with the NVIDIA driver).
struct Driver {
  Library lib;
  int version = 0;  // cuDriverGetVersion: 13000 for CUDA 13.0
  RLX_CUDA_FN(cuInit);
  RLX_CUDA_FN(cuDriverGetVersion);
  RLX_CUDA_FN(cuGetErrorName);
  RLX_CUDA_FN(cuGetErrorString);
  RLX_CUDA_FN(cuDeviceGetCount);
  RLX_CUDA_FN(cuDeviceGet);
  RLX_CUDA_FN(cuDeviceGetName);
  RLX_CUDA_FN(cuDeviceGetAttribute);
  RLX_CUDA_FN(cuDeviceTotalMem);
  RLX_CUDA_FN(cuDevicePrimaryCtxRetain);
  RLX_CUDA_FN(cuDevicePrimaryCtxRelease);
  RLX_CUDA_FN(cuCtxSetCurrent);
  RLX_CUDA_FN(cuCtxSynchronize);
  RLX_CUDA_FN(cuMemAlloc);
  RLX_CUDA_FN(cuMemFree);
  RLX_CUDA_FN(cuMemAllocHost);
  RLX_CUDA_FN(cuMemFreeHost);
  RLX_CUDA_FN(cuMemcpyHtoD);
  RLX_CUDA_FN(cuMemcpyDtoH);
  RLX_CUDA_FN(cuMemcpyHtoDAsync);
  RLX_CUDA_FN(cuMemcpyDtoHAsync);
  RLX_CUDA_FN(cuMemcpyDtoDAsync);
  RLX_CUDA_FN(cuMemsetD8Async);
  RLX_CUDA_FN(cuStreamCreate);
  RLX_CUDA_FN(cuStreamDestroy);
  RLX_CUDA_FN(cuStreamSynchronize);
  RLX_CUDA_FN(cuStreamBeginCapture);
  RLX_CUDA_FN(cuStreamEndCapture);
  RLX_CUDA_FN(cuGraphInstantiateWithFlags);
  RLX_CUDA_FN(cuGraphLaunch);
  RLX_CUDA_FN(cuGraphExecDestroy);
  RLX_CUDA_FN(cuGraphDestroy);
  RLX_CUDA_FN(cuEventCreate);
  RLX_CUDA_FN(cuEventDestroy);
  RLX_CUDA_FN(cuEventRecord);
  RLX_CUDA_FN(cuEventRecordWithFlags);
  RLX_CUDA_FN(cuEventSynchronize);
  RLX_CUDA_FN(cuEventElapsedTime);
  RLX_CUDA_FN(cuModuleLoadData);
  RLX_CUDA_FN(cuModuleUnload);
  RLX_CUDA_FN(cuModuleGetFunction);
  RLX_CUDA_FN(cuFuncSetAttribute);
  RLX_CUDA_FN(cuLaunchKernel);
  RLX_CUDA_FN(cuLaunchKernelEx);

  // The process's driver, loaded and initialised once; throws rlx::Error saying why it is not usable.
  static const Driver& get();
  // Throws rlx::Error "cuda: <what>: <CUDA_ERROR_NAME> (<description>)" unless r is CUDA_SUCCESS.
  void check(CUresult r, std::string_view what) const;
};

// NVRTC (libnvrtc.so.13, from the CUDA toolkit or the nvidia-cuda-nvrtc wheel).
struct Nvrtc {
  Library lib;
  int major = 0, minor = 0;
  RLX_CUDA_FN(nvrtcVersion);
  RLX_CUDA_FN(nvrtcGetErrorString);
  RLX_CUDA_FN(nvrtcCreateProgram);
  RLX_CUDA_FN(nvrtcDestroyProgram);
  RLX_CUDA_FN(nvrtcCompileProgram);
  RLX_CUDA_FN(nvrtcGetProgramLogSize);
  RLX_CUDA_FN(nvrtcGetProgramLog);
  RLX_CUDA_FN(nvrtcGetCUBINSize);
  RLX_CUDA_FN(nvrtcGetCUBIN);
  RLX_CUDA_FN(nvrtcGetPTXSize);
  RLX_CUDA_FN(nvrtcGetPTX);

  static const Nvrtc& get();  // throws rlx::Error saying why NVRTC is not usable
};

// cuBLASLt (libcublasLt.so.13): the matmuls.
struct BlasLt {
  Library lib;
  RLX_CUDA_FN(cublasLtCreate);
  RLX_CUDA_FN(cublasLtDestroy);
  RLX_CUDA_FN(cublasLtMatmulDescCreate);
  RLX_CUDA_FN(cublasLtMatmulDescDestroy);
  RLX_CUDA_FN(cublasLtMatmulDescSetAttribute);
  RLX_CUDA_FN(cublasLtMatrixLayoutCreate);
  RLX_CUDA_FN(cublasLtMatrixLayoutDestroy);
  RLX_CUDA_FN(cublasLtMatrixLayoutSetAttribute);
  RLX_CUDA_FN(cublasLtMatmulPreferenceCreate);
  RLX_CUDA_FN(cublasLtMatmulPreferenceDestroy);
  RLX_CUDA_FN(cublasLtMatmulPreferenceSetAttribute);
  RLX_CUDA_FN(cublasLtMatmulAlgoGetHeuristic);
  RLX_CUDA_FN(cublasLtMatmul);

  static const BlasLt& get();  // throws rlx::Error saying why cuBLASLt is not usable
  void check(cublasStatus_t s, std::string_view what) const;
};

#ifdef RLX_HAVE_CUDNN
// cuDNN (libcudnn.so.9): convolutions, through its descriptor API.
struct Cudnn {
  Library lib;
  std::size_t version = 0;  // cudnnGetVersion: 91400 for 9.14
  RLX_CUDA_FN(cudnnGetVersion);
  RLX_CUDA_FN(cudnnGetErrorString);
  RLX_CUDA_FN(cudnnCreate);
  RLX_CUDA_FN(cudnnDestroy);
  RLX_CUDA_FN(cudnnSetStream);
  RLX_CUDA_FN(cudnnCreateTensorDescriptor);
  RLX_CUDA_FN(cudnnDestroyTensorDescriptor);
  RLX_CUDA_FN(cudnnSetTensor4dDescriptor);
  RLX_CUDA_FN(cudnnCreateFilterDescriptor);
  RLX_CUDA_FN(cudnnDestroyFilterDescriptor);
  RLX_CUDA_FN(cudnnSetFilter4dDescriptor);
  RLX_CUDA_FN(cudnnCreateConvolutionDescriptor);
  RLX_CUDA_FN(cudnnDestroyConvolutionDescriptor);
  RLX_CUDA_FN(cudnnSetConvolution2dDescriptor);
  RLX_CUDA_FN(cudnnSetConvolutionGroupCount);
  RLX_CUDA_FN(cudnnSetConvolutionMathType);
  RLX_CUDA_FN(cudnnGetConvolution2dForwardOutputDim);
  RLX_CUDA_FN(cudnnGetConvolutionForwardAlgorithm_v7);
  RLX_CUDA_FN(cudnnGetConvolutionForwardWorkspaceSize);
  RLX_CUDA_FN(cudnnConvolutionForward);
  RLX_CUDA_FN(cudnnAddTensor);

  static const Cudnn& get();  // throws rlx::Error saying why cuDNN is not usable
  void check(cudnnStatus_t s, std::string_view what) const;
};
#endif

#undef RLX_CUDA_FN

// CUDA C compiled by NVRTC for `arch` ("sm_90"), as a cubin (for a virtual
// architecture, "compute_90", as PTX: no machine code, half NVRTC's time). Kept in memory and in
// <cache>/cuda-cubin/<hash>.cubin, keyed by the source, the architecture and
// NVRTC's version. Throws rlx::Error with NVRTC's log, naming `what`.
std::string compile_cubin(const std::string& source, const std::string& arch, std::string_view what);

}  // namespace rlx::backends::cuda
