#ifdef RLX_HAVE_CUDA
// The CUDA backend: traits, compile_lir and the executable.
//
// Kernels are the C target's loop nests in CUDA C (codegen::c::emit_cuda),
// compiled by NVRTC for the device's architecture through the cubin cache;
// matmuls go to cuBLASLt, convolutions to cuDNN, and Native kernels to their
// own programs (quant.hpp, attention.hpp, a custom op's raw kernel:
// raw_kernel.hpp). A
// kernel none of these expresses (control flow left as a host loop) runs on
// the host, through the CPU backend, on staged copies of its operands.
//
// compile_lir lays out one device arena per executable (the LIR memory plan,
// then a region for the inputs), the params and the constants (both shared by
// clones; the params also by the graph compiled at other extents:
// share_params_from) and one pinned host staging buffer (inputs, outputs, host
// kernels' operands). The work between host kernels forms segments; each
// segment (copies in, launches, copies out) is captured once per executable
// as a CUDA graph and replayed by run().
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "backends/cuda/api.hpp"
#include "backends/cuda/attention.hpp"
#include "backends/cuda/conv.hpp"
#include "backends/cuda/gemm_shape.hpp"
#include "backends/cuda/layout.hpp"
#include "backends/cuda/quant.hpp"
#include "backends/cuda/raw_kernel.hpp"
#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/codegen/c.hpp"
#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/runtime/custom_kernels.hpp"
#include "rlx/runtime/handle_checks.hpp"
#include "rlx/runtime/host_kernel.hpp"

namespace rlx::backends::cuda {

namespace {

using compile::BufferId;
using compile::BufferRole;
using Clock = std::chrono::steady_clock;
using runtime::KernelTime;

constexpr std::uint64_t kAlign = kArenaAlignment;  // cudaMalloc's alignment; every buffer starts on it
std::uint64_t align(std::uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
constexpr unsigned kBlock = 256;

// The process's device: the primary context of device 0, made current on each thread that uses it.
class Context {
 public:
  // Made once and kept for the process, as the CUDA runtime keeps its primary context: creating the context
  // (and loading its modules again) for every backend instance cost each short-lived Session hundreds of
  // milliseconds. The driver tears it down at exit.
  static std::shared_ptr<Context> get() {
    static std::mutex mu;
    static std::shared_ptr<Context>* kept = nullptr;
    std::lock_guard lock(mu);
    if (kept) return *kept;
    auto c = std::shared_ptr<Context>(new Context(Driver::get()));
    kept = new std::shared_ptr<Context>(c);  // NOLINT(cppcoreguidelines-owning-memory): never freed, see above
    return c;
  }
  ~Context() {
    for (auto& [key, m] : modules_) drv.cuModuleUnload(m);
    drv.cuDevicePrimaryCtxRelease(device_);
  }
  void make_current() const { drv.check(drv.cuCtxSetCurrent(ctx_), "cuCtxSetCurrent"); }
  bool try_make_current() const noexcept { return drv.cuCtxSetCurrent(ctx_) == CUDA_SUCCESS; }
  // The function `entry` of `source`, compiled once per process (and cached on disk by source).
  CUfunction function(const std::string& source, const std::string& entry, std::string_view what) {
    std::lock_guard lock(mu_);
    auto it = modules_.find(source);
    if (it == modules_.end()) {
      const std::string cubin = compile_cubin(source, info.arch, what);
      CUmodule m = nullptr;
      make_current();
      drv.check(drv.cuModuleLoadData(&m, cubin.data()), fmt::format("loading the module of {}", what));
      it = modules_.emplace(source, m).first;
    }
    CUfunction f = nullptr;
    drv.check(drv.cuModuleGetFunction(&f, it->second, entry.c_str()), fmt::format("finding {} in {}", entry, what));
    return f;
  }

  const Driver& drv;
  DeviceInfo info;

 private:
  explicit Context(const Driver& d) : drv(d) {
    // The process's GPU (runtime::set_gpu; the nccl engine's rank GPU), fixed from now on.
    const int ordinal = runtime::claim_gpu();
    int count = 0;
    drv.check(drv.cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (ordinal >= count)
      throw Error(
          fmt::format("cuda: GPU {} was chosen (runtime::set_gpu), but the driver sees {} GPU(s)", ordinal, count));
    drv.check(drv.cuDeviceGet(&device_, ordinal), "cuDeviceGet");
    char name[256] = {};
    drv.check(drv.cuDeviceGetName(name, sizeof name, device_), "cuDeviceGetName");
    int major = 0, minor = 0;
    drv.check(drv.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device_),
              "compute capability");
    drv.check(drv.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device_),
              "compute capability");
    drv.check(drv.cuDeviceGetAttribute(&info.multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device_),
              "multiprocessor count");
    drv.check(drv.cuDeviceGetAttribute(&info.max_shared_bytes, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                       device_),
              "shared memory per block");
    std::size_t mem = 0;
    drv.check(drv.cuDeviceTotalMem(&mem, device_), "cuDeviceTotalMem");
    info.ordinal = ordinal;
    info.name = name;
    info.arch = fmt::format("sm_{}{}", major, minor);
    info.programmatic_launch = major >= 9;
    info.memory_bytes = mem;
    info.driver_version = drv.version;
    drv.check(drv.cuDevicePrimaryCtxRetain(&ctx_, device_), "cuDevicePrimaryCtxRetain");
  }

  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
  std::mutex mu_;
  std::unordered_map<std::string, CUmodule> modules_;
};

// Device memory, freed with its owner.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(std::shared_ptr<Context> ctx, std::uint64_t bytes, std::string_view what) : ctx_(std::move(ctx)) {
    ctx_->make_current();
    ctx_->drv.check(ctx_->drv.cuMemAlloc(&ptr_, std::max<std::uint64_t>(bytes, kAlign)),
                    fmt::format("allocating {} bytes for {}", bytes, what));
  }
  ~DeviceMemory() {
    if (ptr_ && ctx_->try_make_current()) ctx_->drv.cuMemFree(ptr_);
  }
  DeviceMemory(DeviceMemory&& o) noexcept : ctx_(std::move(o.ctx_)), ptr_(o.ptr_) { o.ptr_ = 0; }
  DeviceMemory& operator=(DeviceMemory&& o) noexcept {
    std::swap(ctx_, o.ctx_);
    std::swap(ptr_, o.ptr_);
    return *this;
  }
  CUdeviceptr get() const { return ptr_; }

 private:
  std::shared_ptr<Context> ctx_;
  CUdeviceptr ptr_ = 0;
};

// Page-locked host memory: copies from it run asynchronously and can be captured in a graph.
class PinnedMemory {
 public:
  PinnedMemory(std::shared_ptr<Context> ctx, std::uint64_t bytes) : ctx_(std::move(ctx)) {
    ctx_->make_current();
    void* p = nullptr;
    ctx_->drv.check(ctx_->drv.cuMemAllocHost(&p, std::max<std::uint64_t>(bytes, kAlign)),
                    fmt::format("allocating {} bytes of pinned host staging", bytes));
    ptr_ = static_cast<std::byte*>(p);
  }
  ~PinnedMemory() {
    if (ptr_ && ctx_->try_make_current()) ctx_->drv.cuMemFreeHost(ptr_);
  }
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;
  std::byte* get() const { return ptr_; }

 private:
  std::shared_ptr<Context> ctx_;
  std::byte* ptr_ = nullptr;
};

struct Copy {
  Loc src, dst;
  std::uint64_t bytes = 0;
  int input = -1, output = -1;  // the graph input it brings in, or the graph output it takes out
};

// A matmul through cuBLASLt: row-major C[M,N] = A[M,K] B[K,N] in each of `batch` strided batches, issued as
// the column-major product C^T = B^T A^T (cuBLASLt's "A" is our B). The descriptors and the algorithm are
// made once at compile time and shared by clones.
struct Gemm {
  const BlasLt* lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our B), B (our A), C = D
  cublasLtMatmulAlgo_t algo{};
  bool f64 = false;
  // Its epilogue's operands (gemm_shape.hpp): the residual as C with beta 1, and the bias, whose pointer is an
  // attribute of the shared descriptor, set under `bias_mutex` right before each clone's capture of the call.
  bool residual = false, bias = false;
  mutable std::mutex bias_mutex;
  Gemm() = default;
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  ~Gemm() {
    if (!lt) return;
    for (auto* l : {a, b, c})
      if (l) lt->cublasLtMatrixLayoutDestroy(l);
    if (desc) lt->cublasLtMatmulDescDestroy(desc);
  }
};
constexpr std::uint64_t kGemmWorkspace = std::uint64_t(32) << 20;

// A device address as the pointer the CUDA libraries take (cuBLASLt's operands are void*).
void* pointer(CUdeviceptr p) {
  return reinterpret_cast<void*>(p);  // NOLINT(performance-no-int-to-ptr): device addresses are integers here
}

struct Launch {
  std::size_t kernel = 0;  // the LIR kernel it is a phase of
  std::string entry;       // the generated function, found in the graph's program as `fn`
  CUfunction fn = nullptr;
  unsigned grid = 1, block = 1;
  std::vector<Loc> operands;  // the kernel's inputs, then its outputs (then the product, for an epilogue)
  // A function of quant_program(quant_type) instead of the graph's program: its 64-bit scalars follow the
  // operands.
  bool quant = false;
  ir::DType quant_type = ir::DType::F32;
  std::vector<std::int64_t> scalars;
  // A cuBLASLt matmul instead of a function: operands are A, B and where the product goes.
  std::shared_ptr<const Gemm> gemm;
  // A cuDNN convolution instead: operands are x, w, the bias (or x again when there is none) and y.
  std::shared_ptr<const ConvPlan> conv;
  // A function of a program of its own (a custom op's raw kernel, flash attention): compiled from `source`, named
  // `what` in errors, launched with `shared` bytes of dynamic shared memory after the copies in `pre` (a raw
  // kernel's operands that live outside the arena, into arena scratch).
  std::string source, what;
  unsigned shared = 0;
  std::vector<Copy> pre;
  // The function starts with rlx_grid_dependency_wait (codegen::c::kCudaGridDependencyWait): after another such
  // launch it may be a programmatic dependent launch. Not a custom op's raw kernel, whose text is the user's.
  bool waits_for_grid = false;
};

struct HostStep {
  std::size_t kernel = 0;
  runtime::StagedKernel prototype;
  std::vector<std::uint64_t> in_off, out_off;  // in staging
};

struct Segment {
  std::vector<Copy> head;
  std::vector<std::size_t> launches;  // indices into Plan::launches
  std::vector<Copy> tail;
  int host = -1;  // the host step run after it
};

// Immutable after compile_lir; shared by clones.
struct Plan {
  std::shared_ptr<Context> ctx;
  std::vector<std::string> kernel_names;
  // Scratch one launch writes and the next reads (the stream runs them in order, so they share it): matmul
  // products an epilogue reads, and flash attention's key-range partials its combine reads.
  std::uint64_t product_bytes = 0;
  bool gemms = false;
  bool convs = false;
  // Kernels that wait for the previous grid are launched programmatically after one another (Launch::waits_for_grid;
  // sm_90 and later, unless RLX_CUDA_PROGRAMMATIC_LAUNCH=0).
  bool programmatic = false;
  std::uint64_t conv_workspace = 0;  // cuDNN's, the largest any convolution asks
  std::uint64_t arena_bytes = 0, staging_bytes = 0, params_bytes = 0, constants_bytes = 0;
  std::vector<std::uint64_t> in_staging, in_bytes, out_staging, out_bytes, param_off, param_bytes;
  std::vector<Loc> in_loc, out_loc;  // where each graph input and output lives on the device
  std::vector<Launch> launches;
  std::vector<HostStep> host;
  std::vector<Segment> segments;
};

// Device memory an executable shares with its clones; the params also with the graph's executables at other
// extents (share_params_from).
struct Weights {
  std::shared_ptr<DeviceMemory> params, constants;
};

class CudaExecutable final : public runtime::ExecutableGraph {
 public:
  CudaExecutable(std::shared_ptr<const Plan> plan, Weights weights);
  ~CudaExecutable() override;
  CudaExecutable(const CudaExecutable&) = delete;
  CudaExecutable& operator=(const CudaExecutable&) = delete;

  void set_param(std::size_t index, const void* data, std::size_t nbytes) override;
  void run(std::span<const void* const> inputs, std::span<void* const> outputs) override;
  std::unique_ptr<runtime::ExecutableGraph> clone() const override {
    return std::make_unique<CudaExecutable>(plan_, weights_);
  }
  runtime::ExecutableCapabilities capabilities() const override {
    return {.clone = true,
            .persistent_handles = true,
            .gpu_handles = true,
            .kv_resident = true,
            .async_pipeline = true,
            .active_extent = true,
            .read_outputs = true,
            .kernel_times = true,
            .handle_addresses = true};
  }
  void run_read_outputs(std::span<const void* const> inputs, std::span<void* const> outputs) override;
  // commit_no_wait runs every segment but the last to completion (host kernels included) and launches the last
  // one's graph; sync_pending waits for it and copies the outputs out. Any other call in between throws.
  void commit_no_wait(std::span<const void* const> inputs, std::span<void* const> outputs) override;
  void sync_pending() override;
  // With one segment (no host kernels), two staging buffers alternate, each with its own recorded graph: set k + 1
  // is staged and launched while set k runs, and set k's outputs are copied out while set k + 1 runs. Otherwise
  // the sets run in order.
  void run_pipelined(std::span<const std::vector<const void*>> inputs,
                     std::span<const std::vector<void*>> outputs) override;
  // Reads the params of `src` (the graph at another extent) in its device memory from now on: the launches'
  // operands and the recorded graphs are made again against it.
  void share_params_from(const runtime::ExecutableGraph& src) override;
  // A handle is the input's own place in device memory: runs read it there, with no copy in.
  void bind_handle(std::size_t input_index, const void* data, std::size_t nbytes) override;
  void read_handle(std::size_t input_index, void* dst, std::size_t nbytes) const override;
  // Device to device, when `dst` is a CUDA executable of the same context.
  void copy_handle_to(std::size_t input_index, runtime::ExecutableGraph& dst, std::size_t nbytes) const override;
  runtime::DeviceAddress handle_address(std::size_t input_index) const override;
  void feed_handle(std::size_t input_index, std::size_t output_index) override;
  // Profiling puts a pair of timing events around each kernel in the captured graphs; off (the default), the
  // graphs hold the kernels and copies alone.
  void set_profiling(bool on) override;
  std::vector<KernelTime> kernel_times() const override;

 private:
  CUdeviceptr device(const Loc& l) const {
    switch (l.where) {
      case Where::Params: return weights_.params->get() + l.offset;
      case Where::Constants: return weights_.constants->get() + l.offset;
      case Where::Product: return product_.get() + l.offset;
      default: return arena_.get() + l.offset;
    }
  }
  // args_: each launch's operand addresses (arg_ptrs_ point into them, so their number never changes).
  void resolve_operands();
  void enqueue(const Copy& c, std::byte* staging) const;
  CUgraphExec capture(std::size_t s, std::byte* staging);
  void record(std::size_t s);
  void record_all();
  void drop_pipeline_graph();
  runtime::HandleChecks handle_checks() const { return {"cuda", plan_->in_bytes, plan_->out_bytes}; }
  void require_idle(std::string_view method) const;
  // A run's two halves (run_read_outputs is both): begin stages the inputs into `staging`, runs every segment
  // but the last (with the host kernels after them) and launches the last one's graph (`last`); end waits for the
  // stream and copies the outputs asked for out of `staging`.
  void check_run(std::span<const void* const> inputs, std::span<void* const> outputs) const;
  void want_outputs(std::span<void* const> outputs);
  void begin(std::span<const void* const> inputs, std::byte* staging, CUgraphExec last);
  void end(std::span<void* const> outputs, const std::byte* staging);
  void copy_out(std::span<void* const> outputs, const std::byte* staging);

  std::shared_ptr<const Plan> plan_;
  Weights weights_;
  const Context& ctx_;
  DeviceMemory arena_;
  PinnedMemory staging_;
  DeviceMemory product_, workspace_, conv_workspace_;
  cublasLtHandle_t lt_ = nullptr;
  ConvHandle dnn_;
  CUstream stream_ = nullptr;
  std::vector<std::vector<CUdeviceptr>> args_;  // per launch: its operands' addresses
  std::vector<std::vector<void*>> arg_ptrs_;    // per launch: pointers to those, as cuLaunchKernel takes them
  std::vector<CUgraphExec> graphs_;             // per segment
  std::vector<runtime::StagedKernel> host_;     // clones of the plan's host kernels (own arenas)
  std::vector<std::vector<const void*>> host_in_;
  std::vector<std::vector<void*>> host_out_;
  std::vector<double> host_micros_;
  std::vector<std::pair<CUevent, CUevent>> events_;  // per LIR kernel run on the device; null for host kernels
  bool ran_ = false, profiling_ = false;
  std::vector<bool> bound_;  // per input: a handle, read in place (no copy in)
  std::vector<bool> read_;   // per output: copied out (the last segment's graph is recorded for this set)
  std::vector<std::pair<std::size_t, std::size_t>> feeds_;  // (input, output): copied into the handle after a run
  // commit_no_wait's run, until sync_pending: the outputs to copy out.
  bool pending_ = false;
  std::vector<void*> pending_out_;
  // run_pipelined's second staging buffer and the one segment's graph recorded against it (made on first use,
  // dropped whenever the graphs are recorded again), and an event after each buffer's last launch.
  std::unique_ptr<PinnedMemory> pipeline_staging_;
  CUgraphExec pipeline_graph_ = nullptr;
  std::array<CUevent, 2> done_{nullptr, nullptr};
};

CudaExecutable::CudaExecutable(std::shared_ptr<const Plan> plan, Weights weights)
    : plan_(std::move(plan)),
      weights_(std::move(weights)),
      ctx_(*plan_->ctx),
      arena_(plan_->ctx, plan_->arena_bytes, "the arena"),
      staging_(plan_->ctx, plan_->staging_bytes) {
  const Driver& drv = ctx_.drv;
  ctx_.make_current();
  drv.check(drv.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  if (plan_->product_bytes)
    product_ = DeviceMemory(plan_->ctx, plan_->product_bytes, "matmul products and attention partials");
  if (plan_->gemms) {
    workspace_ = DeviceMemory(plan_->ctx, kGemmWorkspace, "cuBLASLt's workspace");
    const BlasLt& lt = BlasLt::get();
    lt.check(lt.cublasLtCreate(&lt_), "cublasLtCreate");
  }
  if (plan_->convs) {
    dnn_ = ConvHandle(stream_);
    if (plan_->conv_workspace) conv_workspace_ = DeviceMemory(plan_->ctx, plan_->conv_workspace, "cuDNN's workspace");
  }
  args_.resize(plan_->launches.size());
  resolve_operands();
  for (auto& a : args_) {
    auto& p = arg_ptrs_.emplace_back();
    for (auto& x : a) p.push_back(&x);
  }
  for (const auto& h : plan_->host) {
    runtime::StagedKernel k{h.prototype.exe->clone(), h.prototype.input_bytes, h.prototype.output_bytes};
    auto& in = host_in_.emplace_back();
    auto& out = host_out_.emplace_back();
    for (auto off : h.in_off) in.push_back(staging_.get() + off);
    for (auto off : h.out_off) out.push_back(staging_.get() + off);
    host_.push_back(std::move(k));
  }
  host_micros_.assign(plan_->host.size(), 0.0);
  events_.assign(plan_->kernel_names.size(), {nullptr, nullptr});
  for (const Launch& l : plan_->launches)
    if (!events_[l.kernel].first) {
      drv.check(drv.cuEventCreate(&events_[l.kernel].first, CU_EVENT_DEFAULT), "cuEventCreate");
      drv.check(drv.cuEventCreate(&events_[l.kernel].second, CU_EVENT_DEFAULT), "cuEventCreate");
    }
  bound_.assign(plan_->in_bytes.size(), false);
  read_.assign(plan_->out_bytes.size(), true);
  graphs_.assign(plan_->segments.size(), nullptr);
  record_all();
}

void CudaExecutable::resolve_operands() {
  for (std::size_t k = 0; k < plan_->launches.size(); ++k) {
    const Launch& l = plan_->launches[k];
    std::vector<CUdeviceptr> a;
    for (const Loc& o : l.operands) a.push_back(device(o));
    for (std::int64_t v : l.scalars) a.push_back(CUdeviceptr(v));  // a `long long` parameter: the same 8 bytes
    if (args_[k].empty())
      args_[k] = std::move(a);
    else
      std::copy(a.begin(), a.end(), args_[k].begin());  // in place: arg_ptrs_ point at these
  }
}

void CudaExecutable::drop_pipeline_graph() {
  if (pipeline_graph_) ctx_.drv.cuGraphExecDestroy(pipeline_graph_);
  pipeline_graph_ = nullptr;
}

void CudaExecutable::record_all() {
  ctx_.make_current();
  drop_pipeline_graph();
  for (std::size_t s = 0; s < plan_->segments.size(); ++s) {
    if (graphs_[s]) ctx_.drv.cuGraphExecDestroy(graphs_[s]);
    graphs_[s] = nullptr;
    record(s);
  }
}

void CudaExecutable::set_profiling(bool on) {
  require_idle("set_profiling");
  if (on == profiling_) return;
  profiling_ = on;
  ran_ = false;  // kernel_times() is empty until a run with the new setting
  record_all();
}

void CudaExecutable::bind_handle(std::size_t input_index, const void* data, std::size_t nbytes) {
  require_idle("bind_handle");
  handle_checks().input("bind_handle", input_index, nbytes);
  ctx_.make_current();
  const Driver& drv = ctx_.drv;
  if (nbytes) drv.check(drv.cuMemcpyHtoD(device(plan_->in_loc[input_index]), data, nbytes), "bind_handle: uploading");
  drv.check(drv.cuCtxSynchronize(), "bind_handle");  // see set_param
  if (!bound_[input_index]) {
    bound_[input_index] = true;
    record_all();
  }
}

void CudaExecutable::read_handle(std::size_t input_index, void* dst, std::size_t nbytes) const {
  require_idle("read_handle");
  handle_checks().input("read_handle", input_index, nbytes);
  handle_checks().bound("read_handle", input_index, bound_);
  ctx_.make_current();
  const Driver& drv = ctx_.drv;
  drv.check(drv.cuStreamSynchronize(stream_), "read_handle");
  if (nbytes) drv.check(drv.cuMemcpyDtoH(dst, device(plan_->in_loc[input_index]), nbytes), "read_handle");
}

void CudaExecutable::copy_handle_to(std::size_t input_index, runtime::ExecutableGraph& dst, std::size_t nbytes) const {
  auto* other = dynamic_cast<CudaExecutable*>(&dst);
  if (!other || &other->ctx_ != &ctx_) return ExecutableGraph::copy_handle_to(input_index, dst, nbytes);
  require_idle("copy_handle_to");
  other->require_idle("copy_handle_to");
  handle_checks().input("copy_handle_to", input_index, nbytes);
  other->handle_checks().input("copy_handle_to", input_index, nbytes);
  handle_checks().bound("copy_handle_to", input_index, bound_);
  ctx_.make_current();
  const Driver& drv = ctx_.drv;
  drv.check(drv.cuStreamSynchronize(stream_), "copy_handle_to");  // this executable's last run wrote it
  if (nbytes) {
    drv.check(drv.cuMemcpyDtoDAsync(other->device(other->plan_->in_loc[input_index]),
                                    device(plan_->in_loc[input_index]), nbytes, other->stream_),
              "copy_handle_to");
    drv.check(drv.cuStreamSynchronize(other->stream_), "copy_handle_to");
  }
  if (!other->bound_[input_index]) {
    other->bound_[input_index] = true;
    other->record_all();
  }
}

runtime::DeviceAddress CudaExecutable::handle_address(std::size_t input_index) const {
  require_idle("handle_address");
  handle_checks().bound("handle_address", input_index, bound_);
  ctx_.make_current();
  ctx_.drv.check(ctx_.drv.cuStreamSynchronize(stream_), "handle_address");  // the last run's writes are there
  return {pointer(device(plan_->in_loc[input_index])), plan_->in_bytes[input_index], ctx_.info.ordinal};
}

void CudaExecutable::feed_handle(std::size_t input_index, std::size_t output_index) {
  require_idle("feed_handle");
  handle_checks().feed(input_index, output_index, bound_);
  for (auto& f : feeds_)
    if (f.first == input_index) {
      f.second = output_index;
      return record_all();
    }
  feeds_.emplace_back(input_index, output_index);
  record_all();
}

CudaExecutable::~CudaExecutable() {
  const Driver& drv = ctx_.drv;
  if (!ctx_.try_make_current()) return;
  for (CUgraphExec g : graphs_)
    if (g) drv.cuGraphExecDestroy(g);
  if (pipeline_graph_) drv.cuGraphExecDestroy(pipeline_graph_);
  dnn_ = ConvHandle();  // before its stream
  if (stream_) {
    drv.cuStreamSynchronize(stream_);
    drv.cuStreamDestroy(stream_);
  }
  for (auto [a, b] : events_) {
    if (a) drv.cuEventDestroy(a);
    if (b) drv.cuEventDestroy(b);
  }
  for (CUevent e : done_)
    if (e) drv.cuEventDestroy(e);
  if (lt_) BlasLt::get().cublasLtDestroy(lt_);
}

void CudaExecutable::enqueue(const Copy& c, std::byte* staging) const {
  if (!c.bytes) return;
  const Driver& drv = ctx_.drv;
  if (c.src.where == Where::Staging)
    drv.check(drv.cuMemcpyHtoDAsync(device(c.dst), staging + c.src.offset, c.bytes, stream_), "a copy in");
  else if (c.dst.where == Where::Staging)
    drv.check(drv.cuMemcpyDtoHAsync(staging + c.dst.offset, device(c.src), c.bytes, stream_), "a copy out");
  else
    drv.check(drv.cuMemcpyDtoDAsync(device(c.dst), device(c.src), c.bytes, stream_), "a device copy");
}

void CudaExecutable::record(std::size_t s) { graphs_[s] = capture(s, staging_.get()); }

// Captures segment s (copies in, launches, copies out, through `staging`) as a CUDA graph.
CUgraphExec CudaExecutable::capture(std::size_t s, std::byte* staging) {
  const Driver& drv = ctx_.drv;
  const Segment& seg = plan_->segments[s];
  drv.check(drv.cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture");
  // Whether the work just enqueued is a kernel of ours that waits for its predecessor (Launch::waits_for_grid):
  // the next such kernel is then launched programmatically, overlapping its launch with that kernel's run (0.67 µs
  // over the two edges of cuda_bench's 3-kernel graph on an H100), and the graph keeps the edge. Not while profiling,
  // whose events time each kernel alone.
  bool after_waiting_kernel = false;
  try {
    for (const auto& c : seg.head)
      if (c.input < 0 || !bound_[std::size_t(c.input)]) enqueue(c, staging);
    for (std::size_t i = 0; i < seg.launches.size(); ++i) {
      const std::size_t li = seg.launches[i];
      const Launch& l = plan_->launches[li];
      const bool first = i == 0 || plan_->launches[seg.launches[i - 1]].kernel != l.kernel;
      const bool last = i + 1 == seg.launches.size() || plan_->launches[seg.launches[i + 1]].kernel != l.kernel;
      // Events recorded during capture can be timed outside the graph only as external record nodes (a
      // plain record there makes cuEventElapsedTime fail with CUDA_ERROR_INVALID_VALUE, seen on the H200).
      if (first && profiling_)
        drv.check(drv.cuEventRecordWithFlags(events_[l.kernel].first, stream_, CU_EVENT_RECORD_EXTERNAL),
                  "cuEventRecordWithFlags");
      if (const ConvPlan* c = l.conv.get()) {
        const auto& a = args_[li];  // x, w, the bias, y
        dnn_.enqueue(*c, a[0], a[1], a[2], a[3], conv_workspace_.get(), plan_->conv_workspace);
      } else if (const Gemm* g = l.gemm.get()) {
        const float one = 1, zero = 0;
        const double one64 = 1, zero64 = 0;
        const void* alpha = g->f64 ? static_cast<const void*>(&one64) : &one;
        const void* beta = g->f64 ? static_cast<const void*>(&zero64) : g->residual ? &one : &zero;
        const auto& a = args_[li];  // our A, our B, the product, C (the residual) and the bias
        std::unique_lock<std::mutex> bias_lock;
        if (g->bias) {
          bias_lock = std::unique_lock(g->bias_mutex);
          void* bias = pointer(a[4]);
          g->lt->check(
              g->lt->cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
              "the bias pointer");
        }
        g->lt->check(g->lt->cublasLtMatmul(lt_, g->desc, alpha, pointer(a[1]), g->a, pointer(a[0]), g->b, beta,
                                           pointer(a[3]), g->c, pointer(a[2]), g->c, &g->algo,
                                           pointer(workspace_.get()), kGemmWorkspace, stream_),
                     "cublasLtMatmul");
      } else {
        for (const auto& c : l.pre) enqueue(c, staging);
        if (l.waits_for_grid && after_waiting_kernel && l.pre.empty() && plan_->programmatic) {
          CUlaunchAttribute programmatic{};
          programmatic.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
          programmatic.value.programmaticStreamSerializationAllowed = 1;
          CUlaunchConfig config{};
          config.gridDimX = l.grid;
          config.gridDimY = config.gridDimZ = 1;
          config.blockDimX = l.block;
          config.blockDimY = config.blockDimZ = 1;
          config.sharedMemBytes = l.shared;
          config.hStream = stream_;
          config.attrs = &programmatic;
          config.numAttrs = 1;
          drv.check(drv.cuLaunchKernelEx(&config, l.fn, arg_ptrs_[li].data(), nullptr), "cuLaunchKernelEx");
        } else {
          drv.check(
              drv.cuLaunchKernel(l.fn, l.grid, 1, 1, l.block, 1, 1, l.shared, stream_, arg_ptrs_[li].data(), nullptr),
              "cuLaunchKernel");
        }
      }
      after_waiting_kernel = l.waits_for_grid && !profiling_;  // never a cuBLASLt or cuDNN launch
      if (last && profiling_)
        drv.check(drv.cuEventRecordWithFlags(events_[l.kernel].second, stream_, CU_EVENT_RECORD_EXTERNAL),
                  "cuEventRecordWithFlags");
    }
    for (const auto& c : seg.tail)
      if (c.output < 0 || read_[std::size_t(c.output)]) enqueue(c, staging);
    if (s + 1 == plan_->segments.size())
      for (auto [i, j] : feeds_)
        if (plan_->in_bytes[i] && device(plan_->out_loc[j]) != device(plan_->in_loc[i]))
          enqueue({plan_->out_loc[j], plan_->in_loc[i], plan_->in_bytes[i]}, staging);
  } catch (...) {
    CUgraph g = nullptr;
    drv.cuStreamEndCapture(stream_, &g);
    if (g) drv.cuGraphDestroy(g);
    throw;
  }
  CUgraph g = nullptr;
  drv.check(drv.cuStreamEndCapture(stream_, &g), "cuStreamEndCapture");
  CUgraphExec exec = nullptr;
  CUresult r = drv.cuGraphInstantiateWithFlags(&exec, g, 0);
  drv.cuGraphDestroy(g);
  drv.check(r, "cuGraphInstantiateWithFlags");
  return exec;
}

void CudaExecutable::set_param(std::size_t index, const void* data, std::size_t nbytes) {
  require_idle("set_param");
  if (index >= plan_->param_bytes.size())
    throw Error(fmt::format("cuda: param index {} out of range ({} params)", index, plan_->param_bytes.size()));
  if (nbytes != plan_->param_bytes[index])
    throw Error(fmt::format("cuda: param {} expects {} bytes, got {}", index, plan_->param_bytes[index], nbytes));
  if (!nbytes) return;
  // A synchronous copy from pageable memory may return before its DMA lands, and the runs' streams do not
  // wait on the legacy stream: the context is synchronized before any run can read the param.
  ctx_.make_current();
  const Driver& drv = ctx_.drv;
  drv.check(drv.cuMemcpyHtoD(weights_.params->get() + plan_->param_off[index], data, nbytes), "uploading a param");
  drv.check(drv.cuCtxSynchronize(), "uploading a param");
}

void CudaExecutable::require_idle(std::string_view method) const {
  if (pending_) throw Error(fmt::format("cuda: {}: a commit_no_wait is pending; call sync_pending first", method));
}

void CudaExecutable::run(std::span<const void* const> inputs, std::span<void* const> outputs) {
  require_idle("run");
  for (std::size_t j = 0; j < outputs.size() && j < plan_->out_bytes.size(); ++j)
    if (!outputs[j] && plan_->out_bytes[j])
      throw Error(fmt::format("cuda: run() got a null pointer for output {} (run_read_outputs skips outputs)", j));
  run_read_outputs(inputs, outputs);
}

void CudaExecutable::check_run(std::span<const void* const> inputs, std::span<void* const> outputs) const {
  const Plan& p = *plan_;
  if (inputs.size() != p.in_bytes.size() || outputs.size() != p.out_bytes.size())
    throw Error(fmt::format("cuda: run() got {} inputs and {} outputs, expected {} and {}", inputs.size(),
                            outputs.size(), p.in_bytes.size(), p.out_bytes.size()));
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (p.in_bytes[i] && !bound_[i] && !inputs[i])
      throw Error(fmt::format("cuda: run() got a null pointer for input {}, which has no handle", i));
}

// The last segment's graphs copy out the outputs asked for: recorded again when another set is asked.
void CudaExecutable::want_outputs(std::span<void* const> outputs) {
  const Plan& p = *plan_;
  // An empty output counts as read whatever its pointer (an empty vector's data() may be null).
  auto wanted = [&](std::size_t j) { return outputs[j] != nullptr || !p.out_bytes[j]; };
  bool same = true;
  for (std::size_t j = 0; j < outputs.size(); ++j) same = same && read_[j] == wanted(j);
  if (same) return;
  for (std::size_t j = 0; j < outputs.size(); ++j) read_[j] = wanted(j);
  const std::size_t last = p.segments.size() - 1;
  ctx_.drv.cuGraphExecDestroy(graphs_[last]);
  graphs_[last] = nullptr;
  drop_pipeline_graph();
  record(last);
}

void CudaExecutable::begin(std::span<const void* const> inputs, std::byte* staging, CUgraphExec last) {
  const Plan& p = *plan_;
  const Driver& drv = ctx_.drv;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (p.in_bytes[i] && !bound_[i]) std::memcpy(staging + p.in_staging[i], inputs[i], p.in_bytes[i]);
  for (std::size_t s = 0; s + 1 < p.segments.size(); ++s) {
    drv.check(drv.cuGraphLaunch(graphs_[s], stream_), "cuGraphLaunch");
    drv.check(drv.cuStreamSynchronize(stream_), "running the graph's kernels");
    const auto h = std::size_t(p.segments[s].host);  // every segment but the last ends at a host kernel
    const auto t0 = Clock::now();
    host_[h].run(host_in_[h], host_out_[h]);
    host_micros_[h] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  drv.check(drv.cuGraphLaunch(last, stream_), "cuGraphLaunch");
}

void CudaExecutable::end(std::span<void* const> outputs, const std::byte* staging) {
  ctx_.drv.check(ctx_.drv.cuStreamSynchronize(stream_), "running the graph's kernels");
  copy_out(outputs, staging);
}

void CudaExecutable::copy_out(std::span<void* const> outputs, const std::byte* staging) {
  const Plan& p = *plan_;
  for (std::size_t j = 0; j < outputs.size(); ++j)
    if (p.out_bytes[j] && outputs[j]) std::memcpy(outputs[j], staging + p.out_staging[j], p.out_bytes[j]);
  ran_ = true;
}

void CudaExecutable::run_read_outputs(std::span<const void* const> inputs, std::span<void* const> outputs) {
  require_idle("run_read_outputs");
  check_run(inputs, outputs);
  ctx_.make_current();
  want_outputs(outputs);
  begin(inputs, staging_.get(), graphs_.back());
  end(outputs, staging_.get());
}

void CudaExecutable::commit_no_wait(std::span<const void* const> inputs, std::span<void* const> outputs) {
  require_idle("commit_no_wait");
  check_run(inputs, outputs);
  ctx_.make_current();
  want_outputs(outputs);
  begin(inputs, staging_.get(), graphs_.back());
  pending_ = true;
  pending_out_.assign(outputs.begin(), outputs.end());
}

void CudaExecutable::sync_pending() {
  if (!pending_) return;
  pending_ = false;  // whatever the wait says: the run is over
  ctx_.make_current();
  end(pending_out_, staging_.get());
}

void CudaExecutable::run_pipelined(std::span<const std::vector<const void*>> inputs,
                                   std::span<const std::vector<void*>> outputs) {
  require_idle("run_pipelined");
  if (inputs.size() != outputs.size())
    throw Error(fmt::format("cuda: run_pipelined got {} input sets and {} output sets", inputs.size(), outputs.size()));
  for (std::size_t k = 0; k < inputs.size(); ++k) check_run(inputs[k], outputs[k]);
  // Host kernels between segments, or sets that read different outputs: one set after the other.
  bool same_outputs = true;
  for (std::size_t k = 1; k < outputs.size(); ++k)
    for (std::size_t j = 0; j < outputs[k].size(); ++j)
      same_outputs = same_outputs && (outputs[k][j] == nullptr) == (outputs[0][j] == nullptr);
  if (plan_->segments.size() > 1 || inputs.size() < 2 || !same_outputs) {
    for (std::size_t k = 0; k < inputs.size(); ++k) run_read_outputs(inputs[k], outputs[k]);
    return;
  }
  const Driver& drv = ctx_.drv;
  ctx_.make_current();
  want_outputs(outputs[0]);
  if (!pipeline_staging_) pipeline_staging_ = std::make_unique<PinnedMemory>(plan_->ctx, plan_->staging_bytes);
  if (!pipeline_graph_) pipeline_graph_ = capture(0, pipeline_staging_->get());
  for (CUevent& e : done_)
    if (!e) drv.check(drv.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  std::byte* const staging[2] = {staging_.get(), pipeline_staging_->get()};
  const CUgraphExec graph[2] = {graphs_[0], pipeline_graph_};
  const std::size_t n = inputs.size();
  try {
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t b = k % 2;
      if (k >= 2) {  // set k - 2 used this buffer: its outputs out first
        drv.check(drv.cuEventSynchronize(done_[b]), "running the graph's kernels");
        copy_out(outputs[k - 2], staging[b]);
      }
      begin(inputs[k], staging[b], graph[b]);
      drv.check(drv.cuEventRecord(done_[b], stream_), "cuEventRecord");
    }
    drv.check(drv.cuStreamSynchronize(stream_), "running the graph's kernels");
    for (std::size_t k = n - 2; k < n; ++k) copy_out(outputs[k], staging[k % 2]);
  } catch (...) {
    drv.cuStreamSynchronize(stream_);  // nothing left running on the buffers
    throw;
  }
}

void CudaExecutable::share_params_from(const runtime::ExecutableGraph& src) {
  require_idle("share_params_from");
  const auto* other = dynamic_cast<const CudaExecutable*>(&src);
  if (!other)
    throw Error(
        fmt::format("cuda: share_params_from: the source is an executable of backend '{}'", src.backend_name()));
  if (other->plan_->param_bytes != plan_->param_bytes || other->plan_->param_off != plan_->param_off)
    throw Error("cuda: share_params_from: the source's params differ in number or size");
  if (other->weights_.params == weights_.params) return;
  weights_.params = other->weights_.params;
  resolve_operands();
  record_all();
}

std::vector<KernelTime> CudaExecutable::kernel_times() const {
  require_idle("kernel_times");
  std::vector<KernelTime> out;
  if (!ran_ || !profiling_) return out;
  ctx_.make_current();
  std::vector<int> host_of(plan_->kernel_names.size(), -1);
  for (std::size_t h = 0; h < plan_->host.size(); ++h) host_of[plan_->host[h].kernel] = int(h);
  for (std::size_t k = 0; k < plan_->kernel_names.size(); ++k) {
    KernelTime t{plan_->kernel_names[k], 0.0, host_of[k] >= 0};
    if (t.host) {
      t.micros = host_micros_[std::size_t(host_of[k])];
    } else if (auto [a, b] = events_[k]; a) {
      float ms = 0;
      ctx_.drv.check(ctx_.drv.cuEventElapsedTime(&ms, a, b), "cuEventElapsedTime");
      t.micros = double(ms) * 1e3;
    }
    out.push_back(std::move(t));
  }
  return out;
}

// The cuBLASLt form of a MatMul kernel mapped by gemm_shape: f32 (TF32 tensor cores only when `tf32`), f64, or
// bf16 and f16 operands with f32 accumulation; null with the reason in *why (the generated nest runs it then).
// `offsets` are the byte offsets of our A, our B and the product from 256-byte aligned bases: cuBLASLt picks
// an algorithm for the alignment they have.
// `offsets`: our A's, our B's, the product's and C's (the residual's, or the product's again).
std::shared_ptr<const Gemm> plan_gemm(const GemmShape& shape, std::array<std::uint64_t, 4> offsets, bool tf32,
                                      std::string* why) {
  const bool f64 = shape.f64;
  const std::int64_t n = shape.n, kd = shape.k, rows = shape.rows, batches = shape.batches;
  const BlasLt* lt = nullptr;
  try {
    lt = &BlasLt::get();
  } catch (const Error& e) {
    return *why = e.what(), nullptr;
  }
  auto g = std::make_shared<Gemm>();
  g->lt = lt;
  g->f64 = f64;
  auto data_type = [](ir::DType t) {
    switch (t) {
      case ir::DType::F64: return CUDA_R_64F;
      case ir::DType::BF16: return CUDA_R_16BF;
      case ir::DType::F16: return CUDA_R_16F;
      default: return CUDA_R_32F;
    }
  };
  const cudaDataType_t scale = f64 ? CUDA_R_64F : CUDA_R_32F;
  const cublasComputeType_t compute = f64                                        ? CUBLAS_COMPUTE_64F
                                      : tf32 && shape.operands == ir::DType::F32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                                 : CUBLAS_COMPUTE_32F;
  lt->check(lt->cublasLtMatmulDescCreate(&g->desc, compute, scale), "cublasLtMatmulDescCreate");
  if (const auto& e = shape.epilogue) {
    const cublasLtEpilogue_t epilogue = e->bias ? (e->relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                                : (e->relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
    lt->check(lt->cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
              "the epilogue");
    g->bias = e->bias.has_value();
    g->residual = e->residual.has_value();
  }
  auto layout = [&](cublasLtMatrixLayout_t* l, ir::DType type, std::int64_t rows_, std::int64_t cols,
                    std::int64_t stride) {
    const cudaDataType_t dt = data_type(type);
    lt->check(lt->cublasLtMatrixLayoutCreate(l, dt, std::uint64_t(rows_), std::uint64_t(cols), rows_),
              "cublasLtMatrixLayoutCreate");
    if (batches > 1) {
      const auto n32 = std::int32_t(batches);
      lt->check(lt->cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n32, sizeof n32),
                "batch count");
      lt->check(
          lt->cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
          "batch stride");
    }
  };
  // Column-major views of the row-major operands (gemm_shape.hpp): B as N x K (a transposed B's stored [N, K] as
  // K x N, read with op T), A as K x rows, C as N x rows.
  if (shape.trans_b) {
    const cublasOperation_t t = CUBLAS_OP_T;
    lt->check(lt->cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), "op T");
    layout(&g->a, shape.operands, kd, n, shape.stride_b);
  } else {
    layout(&g->a, shape.operands, n, kd, shape.stride_b);
  }
  layout(&g->b, shape.operands, kd, rows, shape.stride_a);
  layout(&g->c, shape.result, n, rows, shape.stride_c);
  cublasLtMatmulPreference_t pref = nullptr;
  lt->check(lt->cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const std::uint64_t ws = kGemmWorkspace;
  lt->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  auto alignment = [](std::uint64_t off) {
    std::uint32_t a = 256;
    while (a > 1 && off % a) a /= 2;
    return a;
  };
  // cuBLASLt's A is our B, its B our A; C and D are the product.
  const std::uint32_t al_a = alignment(offsets[1]), al_b = alignment(offsets[0]), al_d = alignment(offsets[2]),
                      al_c = alignment(offsets[3]);
  lt->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a);
  lt->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b);
  lt->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c);
  lt->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d);
  cublasLtHandle_t h = nullptr;
  lt->check(lt->cublasLtCreate(&h), "cublasLtCreate");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = lt->cublasLtMatmulAlgoGetHeuristic(h, g->desc, g->a, g->b, g->c, g->c, pref, 1, &result, &found);
  lt->cublasLtDestroy(h);
  lt->cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) return *why = "cuBLASLt has no algorithm for it", nullptr;
  g->algo = result.algo;
  return g;
}

std::shared_ptr<Plan> build_plan(const std::shared_ptr<Context>& ctx, const compile::LirModule& lir,
                                 const compile::CompileOptions& options, Weights& weights) {
  auto plan = std::make_shared<Plan>();
  plan->ctx = ctx;
  plan->programmatic = ctx->info.programmatic_launch && env::get_bool("RLX_CUDA_PROGRAMMATIC_LAUNCH");
  // The arena (the LIR's memory plan, then the inputs), the params and the constants.
  const Layout layout = lay_out(lir);
  const std::vector<std::uint64_t>& input_at = layout.input_at;
  const std::vector<std::uint64_t>& const_off = layout.const_off;
  const std::vector<Loc>& locs = layout.locs;
  plan->arena_bytes = layout.arena_bytes;
  plan->param_off = layout.param_off;
  for (BufferId id : lir.params) plan->param_bytes.push_back(std::uint64_t(lir.buffer(id).nbytes()));
  plan->params_bytes = layout.params_bytes;
  plan->constants_bytes = layout.constants_bytes;

  // Staging: inputs, outputs, then host kernels' operands.
  std::uint64_t staging = 0;
  for (BufferId id : lir.inputs) {
    plan->in_staging.push_back(staging);
    plan->in_bytes.push_back(std::uint64_t(lir.buffer(id).nbytes()));
    staging = align(staging + plan->in_bytes.back());
  }
  for (BufferId id : lir.outputs) {
    plan->out_staging.push_back(staging);
    plan->out_bytes.push_back(std::uint64_t(lir.buffer(id).nbytes()));
    staging = align(staging + plan->out_bytes.back());
  }

  const std::int64_t per_sm = blocks_per_sm();
  const std::int64_t max_grid =
      per_sm == 0 ? std::int64_t(INT32_MAX) : std::int64_t(std::max(ctx->info.multiprocessors, 1)) * per_sm;
  Segment seg;
  for (std::size_t i = 0; i < lir.inputs.size(); ++i)
    seg.head.push_back(
        {{Where::Staging, plan->in_staging[i]}, {Where::Arena, input_at[i]}, plan->in_bytes[i], int(i), -1});
  // One program for the whole graph (NVRTC's cost is partly per program), holding only the functions launched
  // (not a matmul's nest where cuBLASLt runs it); every access it vectorizes rests on the layout's alignment.
  const codegen::c::CudaModule module = codegen::c::emit_cuda(lir, cuda_options(layout, vector_bytes()));
  std::uint64_t raw_scratch = plan->arena_bytes;  // raw kernels' copies of operands from outside the arena
  const std::string what = fmt::format("graph '{}'", lir.name);
  for (std::size_t ki = 0; ki < lir.kernels.size(); ++ki) {
    const auto& k = lir.kernels[ki];
    const auto& code = module.kernels[ki];
    plan->kernel_names.push_back(k.name);
    if (code.why.empty()) {
      std::vector<Loc> operands;
      for (BufferId id : k.inputs) operands.push_back(locs[std::size_t(id)]);
      for (BufferId id : k.outputs) operands.push_back(locs[std::size_t(id)]);
      std::string no_gemm;
      std::shared_ptr<const Gemm> gemm;
      const ir::Node* mm = nullptr;
      std::optional<GemmShape> shape;
      if (k.kind == compile::KernelKind::MatMul) shape = gemm_shape(k, &no_gemm);
      auto loc_of = [&](ir::NodeId input) { return locs[std::size_t(k.input_buffer(k.body.node(input)))]; };
      // cuBLASLt reads the bias from a pointer it aligns to 16 bytes; a view elsewhere keeps the epilogue kernel.
      if (shape && shape->epilogue && shape->epilogue->bias &&
          offset_alignment(loc_of(*shape->epilogue->bias).offset) < 16)
        shape->epilogue.reset();
      // The product lands in the output (as it is, through the output's narrowing cast, or through cuBLASLt's
      // epilogue) or in scratch, which the epilogue kernel reads.
      auto plan_it = [&] {
        const bool direct = code.product_is_output || shape->cast_output || shape->epilogue;
        if (!direct && code.epilogue.empty()) return false;
        const Loc a = loc_of(shape->a), b = loc_of(shape->b);
        const std::uint64_t c = direct ? locs[std::size_t(k.outputs.at(0))].offset : 0;
        const std::uint64_t r =
            shape->epilogue && shape->epilogue->residual ? loc_of(*shape->epilogue->residual).offset : c;
        gemm = plan_gemm(*shape, {a.offset, b.offset, c, r}, options.tf32, &no_gemm);
        return direct;
      };
      bool direct = false;
      if (shape) {
        mm = &k.body.node(shape->matmul);
        direct = plan_it();
        if (!gemm && shape->epilogue) {  // no algorithm with that epilogue: the product and an epilogue kernel
          shape->epilogue.reset();
          direct = plan_it();
        }
      }
      const std::vector<codegen::c::CudaPhase>* phases = &code.phases;
      if (gemm) {
        // Our A and B are the matmul's operands; the product goes to the output, or to scratch for the epilogue.
        Launch l;
        l.kernel = ki;
        l.gemm = gemm;
        l.operands = {loc_of(shape->a), loc_of(shape->b)};
        if (direct) {
          const Loc out = locs[std::size_t(k.outputs.at(0))];
          const auto& e = shape->epilogue;
          l.operands.push_back(out);
          l.operands.push_back(e && e->residual ? loc_of(*e->residual) : out);  // C
          l.operands.push_back(e && e->bias ? loc_of(*e->bias) : out);          // the bias, when there is one
          phases = nullptr;
        } else {
          const auto bytes = std::uint64_t(mm->shape.numel()) * ir::dtype_size(mm->dtype);
          plan->product_bytes = std::max(plan->product_bytes, align(bytes));
          l.operands.push_back({Where::Product, 0});
          l.operands.push_back({Where::Product, 0});
          l.operands.push_back({Where::Product, 0});
          operands.push_back({Where::Product, 0});
          phases = &code.epilogue;
        }
        plan->gemms = true;
        plan->launches.push_back(std::move(l));
        seg.launches.push_back(plan->launches.size() - 1);
      }
      for (const auto& ph : phases ? *phases : std::vector<codegen::c::CudaPhase>{}) {
        if (ph.iterations <= 0) continue;
        Launch l;
        l.kernel = ki;
        l.entry = ph.entry;
        l.waits_for_grid = true;
        // A phase of fewer iterations than a block (a warp reducing a short row) gets the whole warps it needs:
        // a smaller block starts sooner.
        const auto block = unsigned(std::min<std::int64_t>(kBlock, (ph.iterations + 31) / 32 * 32));
        l.block = ph.serial ? 1 : block;
        l.grid = ph.serial ? 1 : unsigned(std::min<std::int64_t>((ph.iterations + block - 1) / block, max_grid));
        l.operands = operands;
        plan->launches.push_back(std::move(l));
        seg.launches.push_back(plan->launches.size() - 1);
      }
      continue;
    }
    // A custom op's raw kernel (raw_kernel.hpp), ahead of the host: it takes precedence over a host kernel of
    // the same name. Its operands are offsets into the arena: those outside it are copied into scratch there.
    if (auto raw = plan_raw_kernel(lir, k)) {
      Launch l;
      l.kernel = ki;
      l.entry = raw->kernel->entry;
      l.source = raw->kernel->source;
      l.what = raw->label;
      l.grid = raw->grid;
      l.block = raw->block;
      l.operands = {{Where::Arena, 0}};  // the arena itself
      auto offset = [&](BufferId id) {
        Loc at = locs[std::size_t(id)];
        if (at.where != Where::Arena) {
          const auto bytes = std::uint64_t(lir.buffer(id).nbytes());
          l.pre.push_back({at, {Where::Arena, raw_scratch}, bytes});
          at = {Where::Arena, raw_scratch};
          raw_scratch = align(raw_scratch + bytes);
        }
        if (at.offset % 4)
          throw Error(
              fmt::format("cuda: {}: operand b{} does not start on 4 bytes (offset {})", raw->label, id, at.offset));
        return std::int64_t(at.offset / 4);
      };
      l.scalars.assign(kRawKernelInputs, 0);
      for (std::size_t i = 0; i < raw->inputs.size(); ++i) l.scalars[i] = offset(raw->inputs[i]);
      l.scalars.push_back(offset(raw->output));
      l.scalars.push_back(raw->n);
      l.fn = ctx->function(l.source, l.entry, l.what);
      plan->launches.push_back(std::move(l));
      seg.launches.push_back(plan->launches.size() - 1);
      continue;
    }
    // A quantized kernel (quant.hpp): a function of the quantized program.
    if (k.kind == compile::KernelKind::Native) {
      QuantLaunch q;
      std::string no_quant;
      if (plan_quant(lir, k, &q, &no_quant)) {
        Launch l;
        l.kernel = ki;
        l.entry = q.entry;
        l.quant = true;
        l.waits_for_grid = true;
        l.quant_type = q.program;
        l.grid = q.grid;
        l.block = q.block;
        for (BufferId id : q.buffers) l.operands.push_back(locs[std::size_t(id)]);
        l.scalars = q.scalars;
        plan->launches.push_back(std::move(l));
        seg.launches.push_back(plan->launches.size() - 1);
        continue;
      }
    }
    // Attention: flash attention of our own (attention.hpp), a program per shape.
    if (k.kind == compile::KernelKind::Native) {
      AttentionLaunch a;
      std::string no_attention;
      if (plan_attention(lir, k, {ctx->info.max_shared_bytes, ctx->info.multiprocessors}, &a, &no_attention)) {
        Launch l;
        l.kernel = ki;
        l.entry = a.entry;
        l.source = std::move(a.source);
        l.what = fmt::format("the flash attention of kernel {}", k.name);
        l.grid = a.grid;
        l.block = a.block;
        l.shared = a.shared;
        l.waits_for_grid = true;
        for (BufferId id : a.buffers) l.operands.push_back(locs[std::size_t(id)]);
        std::optional<Launch> combine;
        if (a.splits > 1) {  // the partials go to the product scratch, and the combine reads them into the output
          const Loc partials{Where::Product, 0};
          plan->product_bytes = std::max(plan->product_bytes, align(a.partial_bytes));
          combine.emplace();
          combine->kernel = ki;
          combine->entry = a.combine_entry;
          combine->source = l.source;
          combine->what = fmt::format("the flash attention of kernel {} (merging its {} key ranges)", k.name, a.splits);
          combine->grid = a.combine_grid;
          combine->block = a.combine_block;
          combine->waits_for_grid = true;
          combine->operands = {partials, l.operands.back()};
          combine->fn = ctx->function(combine->source, combine->entry, combine->what);
          l.operands.back() = partials;
        }
        l.fn = ctx->function(l.source, l.entry, l.what);
        if (l.shared > 48 * 1024)  // past the default, a kernel opts in to the dynamic shared memory it uses
          ctx->drv.check(
              ctx->drv.cuFuncSetAttribute(l.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(l.shared)),
              fmt::format("allowing {} bytes of shared memory to {}", l.shared, l.what));
        plan->launches.push_back(std::move(l));
        seg.launches.push_back(plan->launches.size() - 1);
        if (combine) {
          plan->launches.push_back(std::move(*combine));
          seg.launches.push_back(plan->launches.size() - 1);
        }
        continue;
      }
    }
    // A convolution cuDNN runs.
    if (k.kind == compile::KernelKind::Native) {
      std::string no_conv;
      if (auto conv = plan_conv(k, options.tf32, &no_conv)) {
        Launch l;
        l.kernel = ki;
        l.conv = conv;
        for (const auto& n : k.body.nodes())
          if (n.op == ir::OpKind::Conv1d || n.op == ir::OpKind::Conv2d)
            for (auto in : n.inputs) l.operands.push_back(locs[std::size_t(k.input_buffer(k.body.node(in)))]);
        if (!conv_has_bias(*conv)) l.operands.push_back(l.operands[0]);
        l.operands.push_back(locs[std::size_t(k.outputs.at(0))]);
        plan->convs = true;
        plan->conv_workspace = std::max(plan->conv_workspace, align(conv_workspace_bytes(*conv)));
        plan->launches.push_back(std::move(l));
        seg.launches.push_back(plan->launches.size() - 1);
        continue;
      }
    }
    // No CUDA code: the CPU backend runs this kernel on staged copies of its operands.
    HostStep h;
    h.kernel = ki;
    h.prototype = runtime::compile_host_kernel(lir, ki, options);
    for (std::size_t i = 0; i < k.inputs.size(); ++i) {
      h.in_off.push_back(staging);
      seg.tail.push_back({locs[std::size_t(k.inputs[i])], {Where::Staging, staging}, h.prototype.input_bytes[i]});
      staging = align(staging + h.prototype.input_bytes[i]);
    }
    seg.host = int(plan->host.size());
    plan->segments.push_back(std::move(seg));
    seg = Segment{};
    for (std::size_t j = 0; j < k.outputs.size(); ++j) {
      h.out_off.push_back(staging);
      seg.head.push_back({{Where::Staging, staging}, locs[std::size_t(k.outputs[j])], h.prototype.output_bytes[j]});
      staging = align(staging + h.prototype.output_bytes[j]);
    }
    plan->host.push_back(std::move(h));
  }
  auto in_graph_program = [](const Launch& l) { return !l.entry.empty() && !l.quant && l.source.empty(); };
  std::vector<std::string> entries;
  for (const Launch& l : plan->launches)
    if (in_graph_program(l)) entries.push_back(l.entry);
  if (!entries.empty()) {
    const std::string program = module.program(entries);
    for (Launch& l : plan->launches)
      if (in_graph_program(l)) l.fn = ctx->function(program, l.entry, what);
  }
  for (Launch& l : plan->launches)
    if (l.quant) l.fn = ctx->function(quant_program(l.quant_type), l.entry, "the quantized kernels");
  for (std::size_t j = 0; j < lir.outputs.size(); ++j)
    seg.tail.push_back(
        {locs[std::size_t(lir.outputs[j])], {Where::Staging, plan->out_staging[j]}, plan->out_bytes[j], -1, int(j)});
  for (std::size_t i = 0; i < lir.inputs.size(); ++i) plan->in_loc.push_back({Where::Arena, input_at[i]});
  for (BufferId id : lir.outputs) plan->out_loc.push_back(locs[std::size_t(id)]);
  plan->segments.push_back(std::move(seg));
  plan->staging_bytes = staging;
  plan->arena_bytes = raw_scratch;

  // Params start zeroed, until set_param; constants are uploaded once, here.
  weights.params = std::make_shared<DeviceMemory>(ctx, plan->params_bytes, "params");
  if (plan->params_bytes) {
    ctx->drv.check(ctx->drv.cuMemsetD8Async(weights.params->get(), 0, plan->params_bytes, nullptr), "zeroing params");
    ctx->drv.check(ctx->drv.cuCtxSynchronize(), "zeroing params");
  }
  weights.constants = std::make_shared<DeviceMemory>(ctx, plan->constants_bytes, "constants");
  std::vector<std::byte> up(plan->constants_bytes, std::byte{0});
  for (std::size_t i = 0; i < lir.constant_values.size(); ++i)
    if (auto n = lir.constant_values[i].nbytes())
      std::memcpy(up.data() + const_off[i], lir.constant_values[i].data(), n);
  if (!up.empty()) {
    ctx->drv.check(ctx->drv.cuMemcpyHtoD(weights.constants->get(), up.data(), up.size()), "uploading constants");
    ctx->drv.check(ctx->drv.cuCtxSynchronize(), "uploading constants");  // see set_param
  }
  return plan;
}

class CudaBackend final : public runtime::Backend {
 public:
  CudaBackend() {
    try {
      ctx_ = Context::get();
      (void)Nvrtc::get();
    } catch (const Error& e) {
      ctx_.reset();
      why_ = e.what();
    }
  }
  std::string_view name() const override { return "cuda"; }
  std::string unavailable_reason() const override { return why_; }
  std::string device_name() const override { return ctx_ ? ctx_->info.name : std::string("cuda"); }
  runtime::Calibration calibrate() override { return measure_device(*this); }

  compile::BackendTraits traits() const override { return cuda::traits(); }

  std::unique_ptr<runtime::ExecutableGraph> compile_lir(const compile::LirModule& lir,
                                                        const compile::CompileOptions& options) override {
    if (!ctx_) throw Error("device 'cuda' is unavailable: " + why_);
    Weights weights;
    auto plan = build_plan(ctx_, lir, options, weights);
    return std::make_unique<CudaExecutable>(std::move(plan), std::move(weights));
  }

 private:
  std::shared_ptr<Context> ctx_;
  std::string why_;
};

}  // namespace

std::unique_ptr<runtime::Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

std::string unavailable_reason() { return CudaBackend().unavailable_reason(); }

DeviceInfo selected_device() {
  auto ctx = Context::get();
  return ctx->info;
}

double copy_bandwidth_gbps(std::uint64_t bytes, int reps) {
  auto ctx = Context::get();
  const Driver& drv = ctx->drv;
  DeviceMemory a(ctx, bytes, "a copy benchmark"), b(ctx, bytes, "a copy benchmark");
  CUstream stream = nullptr;
  CUevent start = nullptr, stop = nullptr;
  drv.check(drv.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  drv.check(drv.cuEventCreate(&start, CU_EVENT_DEFAULT), "cuEventCreate");
  drv.check(drv.cuEventCreate(&stop, CU_EVENT_DEFAULT), "cuEventCreate");
  float best = 1e30f;
  for (int r = 0; r < reps + 1; ++r) {  // the first is a warm-up
    drv.check(drv.cuEventRecord(start, stream), "cuEventRecord");
    drv.check(drv.cuMemcpyDtoDAsync(b.get(), a.get(), bytes, stream), "cuMemcpyDtoDAsync");
    drv.check(drv.cuEventRecord(stop, stream), "cuEventRecord");
    drv.check(drv.cuStreamSynchronize(stream), "a copy benchmark");
    float ms = 0;
    drv.check(drv.cuEventElapsedTime(&ms, start, stop), "cuEventElapsedTime");
    if (r > 0) best = std::min(best, ms);
  }
  drv.cuEventDestroy(start);
  drv.cuEventDestroy(stop);
  drv.cuStreamDestroy(stream);
  return 2.0 * double(bytes) / (double(best) * 1e-3) * 1e-9;
}

std::size_t compile_for_arch(const std::string& source, const std::string& arch) {
  return compile_cubin(source, arch, "a test kernel").size();
}

std::string compile_custom_kernel(std::string_view op_name, const std::string& arch) {
  const runtime::CudaKernel* k = runtime::find_cuda_kernel(op_name);
  if (!k) throw Error(fmt::format("cuda: no raw CUDA kernel is registered for custom op '{}'", op_name));
  return compile_cubin(k->source, arch, fmt::format("custom op '{}'", op_name));
}

std::string nvrtc_unavailable_reason() {
  try {
    (void)Nvrtc::get();
    return {};
  } catch (const Error& e) {
    return e.what();
  }
}

}  // namespace rlx::backends::cuda
#endif
