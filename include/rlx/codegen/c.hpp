#pragma once
// The C codegen target: turns an ir::Graph into a dependency-free C99 pair
// (<name>.h, <name>.c) computing the graph with one plain function, for
// places where no RLX runtime exists. It needs nothing from rlx::runtime; the
// emitted code includes only <math.h>, <stdint.h> and <string.h> (link -lm).
//
// The C is emitted from the graph's LIR (rlx/compile/lir.hpp), compiled for
// traits(): one static function per LIR kernel, called in the LIR's order, a
// fused kernel as one loop, and every intermediate at the offset the LIR's
// memory plan gives it in one workspace of MemoryPlan::arena_bytes.
//
// The function takes, in order: one `const T*` per graph input (creation
// order), one `const T*` per param unless params are baked, one `T*` per
// output, and `void* workspace` last when the workspace is caller-provided:
//
//   void mlp(const float* x, const float* w0, const float* b0, float* y);
//
// Buffers are row-major and must not overlap. Composites are decomposed
// by the compile pipeline, so every op the graph reaches after
// decomposition is supported for the dtypes f32, f64, i8, u8, i32, i64
// and bool (stored as one byte, 0 or 1); f16/bf16 and symbolic dims are an
// rlx::Error naming the node. Short scans and ifs on constants are unrolled
// by the pipeline; control flow left as a host loop or branch is an
// rlx::Error. Indices out of range in gather, index_select and scatter_add
// are clamped (the reference rejects them).
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/compile/pipeline.hpp"
#include "rlx/ir/graph.hpp"

namespace rlx::codegen::c {

enum class ParamMode : std::uint8_t {
  Pointers,  // each param is a `const T*` argument
  Baked,     // params are static const arrays in the .c (Options::param_values)
};

enum class WorkspaceMode : std::uint8_t {
  // One static arena in the .c: no argument, but the function is not
  // reentrant (two threads must not call it at once).
  Static,
  // A `void* workspace` last argument of at least <NAME>_WORKSPACE_BYTES
  // bytes, 16-byte aligned (malloc's alignment suffices); reentrant.
  Caller,
};

struct Options {
  std::string function_name;  // empty: the graph name, made a C identifier
  ParamMode params = ParamMode::Pointers;
  std::map<std::string, ir::Tensor, std::less<>> param_values;  // every param, when Baked
  WorkspaceMode workspace = WorkspaceMode::Static;
};

// One pointer argument of the generated function.
struct Arg {
  std::string name;    // the graph's input/param/output name
  std::string c_name;  // the C parameter name
  ir::DType dtype;
  std::vector<std::int64_t> shape;
};

struct Source {
  std::string function_name;
  std::string header_file;  // "<function_name>.h"
  std::string source_file;  // "<function_name>.c"; it includes header_file
  std::string header;
  std::string source;
  std::vector<Arg> inputs, params, outputs;  // params is empty when baked
  std::vector<std::string> kernels;          // the LIR kernels' names, in the order the function runs them
  std::int64_t workspace_bytes = 0;          // the LIR memory plan's arena_bytes
  WorkspaceMode workspace = WorkspaceMode::Static;
};

// What the C target declares to the compile pipeline: every primitive op
// without a decomposition (composites and formula ops are decomposed, control
// flow is only unrolled), fusion as on the CPU, and a 16-byte aligned arena
// without reuse across dtypes.
compile::BackendTraits traits();

// Emits C for `g`: compiles it with compile::compile(g, traits(), {}) and
// emits its LIR. Throws rlx::Error naming the node, op and dtype for what
// the target cannot express, and naming the param for a bad baked value.
Source emit(const ir::Graph& g, const Options& options = {});
// Emits C for an LIR module compiled for traits() (or traits like them: a
// native or control-flow kernel is an rlx::Error naming the kernel).
Source emit(const compile::LirModule& lir, const Options& options = {});
// ---- the CUDA dialect, for GPU backends --------------------------------------
// An LIR module's kernels as CUDA C, for a backend to compile with NVRTC as one
// program. The loop nests are the C target's; each top-level nest is a phase:
// one __global__ function whose iterations are spread over the grid (a
// grid-stride loop over the nest's flattened index). A kernel's phases run in
// order (pad fills its output, then copies the input into it). Every function
// takes its kernel's operands as device pointers: in0.. (Kernel::inputs,
// const) then out0.. (Kernel::outputs).
struct CudaPhase {
  std::string entry;            // the __global__ function
  std::string text;             // its definition (CudaModule::program)
  std::int64_t iterations = 0;  // the nest's flattened extent (0: nothing to launch)
  bool serial = false;          // runs on one thread: an accumulation whose targets may repeat (scatter_add)
};
struct CudaKernelCode {
  std::vector<CudaPhase> phases;
  // MatMul kernels, for a backend that computes the product with a library GEMM: whether the kernel's one
  // output is the product itself (nothing left to run), else the epilogue alone, reading the product (the
  // matmul's row-major result) from one more operand, `rlx_prod`, after the outputs.
  bool product_is_output = false;
  std::vector<CudaPhase> epilogue;
  // Non-empty when the C target cannot express the kernel (control flow left as a host loop, a native
  // composite, a block-quantized type), naming the kernel, node and op: the backend runs it elsewhere.
  std::string why;
};
struct CudaModule {
  std::string source;                   // self-contained CUDA C (no #include): the prelude and every phase
  std::string prelude;                  // the types and helpers every phase may use
  std::vector<CudaKernelCode> kernels;  // per LIR kernel
  // The prelude and only the phases named: a backend compiles what it launches (not the whole nest of a
  // matmul a library GEMM runs).
  std::string program(const std::vector<std::string>& entries) const;
};
// What the emitter may assume of the device memory the backend lays out.
struct CudaOptions {
  // Per LIR buffer (by id): a power of two its device address is known to be a multiple of, in bytes (a
  // view's own address: its root's alignment and its view offset). Missing or smaller than the element size:
  // the element size, and that buffer is read and written element by element.
  std::vector<std::int64_t> buffer_alignment;
  // The same for `rlx_prod`, the product a matmul epilogue reads.
  std::int64_t product_alignment = 0;
  // The bytes a thread of a phase moves per operand and step where the alignment allows (16: one 16-byte
  // access per operand, as float4); under 2 (or no alignment facts): element by element everywhere.
  std::int64_t vector_bytes = 16;
  // How many grid steps a vector phase's loop is unrolled by (1: not unrolled; 0: the compiler's choice).
  std::int64_t vector_unroll = 1;
};
CudaModule emit_cuda(const compile::LirModule& lir, const CudaOptions& options = {});
// Programmatic dependent launch (sm_90 and later). Every function of the CUDA dialect starts by calling
// rlx_grid_dependency_wait(), which this text defines (the prelude carries it; a backend's own programs include
// it too). It lets the grid after it in the stream launch, then waits until the grid launched before it has
// completed and its writes are visible. So a backend may launch such a function with
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION after another such function: its launch overlaps the
// previous kernel's run instead of following its end, and nothing it reads or writes is touched early. (A grid
// launches only once every block of the one before it has started, so the earliest unfinished grid always has
// all its blocks running: the waits cannot deadlock.) Below sm_90 the call is empty, and the attribute must not
// be used.
inline constexpr std::string_view kCudaGridDependencyWait =
    R"(static __device__ __forceinline__ void rlx_grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
)";

// Writes source.header_file and source.source_file into `dir` (created if missing).
void write(const Source& source, const std::filesystem::path& dir);
// The C type used for `dtype` ("float", "int64_t", "uint8_t" for bool, ...);
// throws rlx::Error for f16/bf16.
std::string_view c_type(ir::DType dtype);

}  // namespace rlx::codegen::c
