// The NCCL engine: libnccl.so.2 (NVIDIA's wheel nvidia-nccl-cu13, or a system
// install) and the CUDA driver, both opened with dlopen, so librlx has no
// link-time dependency on either and a machine without them reports the
// engine unavailable. Collectives take buffers in the GPU's memory
// (Memory::Device: DeviceMemory, a CUDA handle) as NCCL does, with nothing
// copied, and host buffers as every engine does: those are copied into device
// scratch buffers on the engine's stream, and the result back. Either way a
// call returns once the collective has finished. NCCL's sums are its own
// (ring or tree order, fixed for a given topology), not rank order. With
// several ranks, rank 0's ncclUniqueId reaches the others over MPI (mpirun)
// or through RLX's TCP store (RANK/WORLD_SIZE launchers).
#include "distributed/engines.hpp"
#include "distributed/tcp_store.hpp"
#include "rlx/error.hpp"

#ifdef RLX_HAVE_NCCL
#include <cuda.h>
#include <nccl.h>

#include <memory>
#include <mutex>

#include "rlx/runtime/backend.hpp"
#include "rlx/runtime/dynamic_library.hpp"
#endif

namespace rlx::distributed::detail {

#ifdef RLX_HAVE_NCCL
namespace {

#define RLX_NCCL_STR2(x) #x
#define RLX_NCCL_STR(x) RLX_NCCL_STR2(x)
#define RLX_NCCL_FN(name) decltype(&::name) name = nullptr  // NOLINT(bugprone-macro-parentheses): a declaration
#define RLX_NCCL_LOAD(obj, name) runtime::load_symbol((obj).lib, (obj).name, RLX_NCCL_STR(name), missing)

// The CUDA driver calls the engine needs: a context, scratch memory, copies and a stream.
struct Cu {
  runtime::Library lib;
  RLX_NCCL_FN(cuInit);
  RLX_NCCL_FN(cuGetErrorName);
  RLX_NCCL_FN(cuDeviceGetCount);
  RLX_NCCL_FN(cuDeviceGet);
  RLX_NCCL_FN(cuDevicePrimaryCtxRetain);
  RLX_NCCL_FN(cuDevicePrimaryCtxRelease);
  RLX_NCCL_FN(cuCtxSetCurrent);
  RLX_NCCL_FN(cuMemAlloc);
  RLX_NCCL_FN(cuMemFree);
  RLX_NCCL_FN(cuMemcpyHtoDAsync);
  RLX_NCCL_FN(cuMemcpyDtoH);
  RLX_NCCL_FN(cuStreamCreate);
  RLX_NCCL_FN(cuStreamSynchronize);
  RLX_NCCL_FN(cuStreamDestroy);

  static const Cu& get() {
    return runtime::load_once<Cu>("distributed: engine nccl", [](Cu& c) -> std::string {
      if (auto why = runtime::open_library(c.lib, {"libcuda.so.1", "libcuda.so"},
                                           "no NVIDIA driver: libcuda.so.1 could not be loaded");
          !why.empty())
        return why;
      std::string missing;
      RLX_NCCL_LOAD(c, cuInit);
      RLX_NCCL_LOAD(c, cuGetErrorName);
      RLX_NCCL_LOAD(c, cuDeviceGetCount);
      RLX_NCCL_LOAD(c, cuDeviceGet);
      RLX_NCCL_LOAD(c, cuDevicePrimaryCtxRetain);
      RLX_NCCL_LOAD(c, cuDevicePrimaryCtxRelease);
      RLX_NCCL_LOAD(c, cuCtxSetCurrent);
      RLX_NCCL_LOAD(c, cuMemAlloc);
      RLX_NCCL_LOAD(c, cuMemFree);
      RLX_NCCL_LOAD(c, cuMemcpyHtoDAsync);
      RLX_NCCL_LOAD(c, cuMemcpyDtoH);
      RLX_NCCL_LOAD(c, cuStreamCreate);
      RLX_NCCL_LOAD(c, cuStreamSynchronize);
      RLX_NCCL_LOAD(c, cuStreamDestroy);
      if (!missing.empty()) return "the NVIDIA driver (" + c.lib.name() + ") lacks " + missing;
      if (CUresult r = c.cuInit(0); r != CUDA_SUCCESS) {
        const char* name = nullptr;
        c.cuGetErrorName(r, &name);
        return std::string("cuInit failed: ") + (name ? name : "unknown error") + " (no usable NVIDIA GPU)";
      }
      return {};
    });
  }
  void check(CUresult r, std::string_view what) const {
    if (r == CUDA_SUCCESS) return;
    const char* name = nullptr;
    cuGetErrorName(r, &name);
    throw Error("distributed: engine nccl: " + std::string(what) + ": " + (name ? name : "unknown error"));
  }
};

struct Nccl {
  runtime::Library lib;
  int version = 0;
  RLX_NCCL_FN(ncclGetVersion);
  RLX_NCCL_FN(ncclGetErrorString);
  RLX_NCCL_FN(ncclGetUniqueId);
  RLX_NCCL_FN(ncclCommInitRank);
  RLX_NCCL_FN(ncclCommDestroy);
  RLX_NCCL_FN(ncclAllReduce);
  RLX_NCCL_FN(ncclAllGather);
  RLX_NCCL_FN(ncclReduceScatter);
  RLX_NCCL_FN(ncclBroadcast);
  RLX_NCCL_FN(ncclSend);
  RLX_NCCL_FN(ncclRecv);

  static const Nccl& get() {
    return runtime::load_once<Nccl>("distributed: engine nccl", [](Nccl& n) -> std::string {
      if (auto why = runtime::open_library(n.lib, {"libnccl.so.2", "libnccl.so"},
                                           "no NCCL: libnccl.so.2 could not be loaded (pip install nvidia-nccl-cu13, "
                                           "and put its nvidia/nccl/lib on LD_LIBRARY_PATH)");
          !why.empty())
        return why;
      std::string missing;
      RLX_NCCL_LOAD(n, ncclGetVersion);
      RLX_NCCL_LOAD(n, ncclGetErrorString);
      RLX_NCCL_LOAD(n, ncclGetUniqueId);
      RLX_NCCL_LOAD(n, ncclCommInitRank);
      RLX_NCCL_LOAD(n, ncclCommDestroy);
      RLX_NCCL_LOAD(n, ncclAllReduce);
      RLX_NCCL_LOAD(n, ncclAllGather);
      RLX_NCCL_LOAD(n, ncclReduceScatter);
      RLX_NCCL_LOAD(n, ncclBroadcast);
      RLX_NCCL_LOAD(n, ncclSend);
      RLX_NCCL_LOAD(n, ncclRecv);
      if (!missing.empty()) return n.lib.name() + " lacks " + missing;
      n.ncclGetVersion(&n.version);
      return {};
    });
  }
  void check(ncclResult_t r, std::string_view what, int rank) const {
    if (r == ncclSuccess) return;
    throw Error("distributed." + std::string(what) + ": NCCL failed on rank " + std::to_string(rank) + ": " +
                ncclGetErrorString(r));
  }
};

void* dev_ptr(CUdeviceptr p) {
  return reinterpret_cast<void*>(p);  // NOLINT(performance-no-int-to-ptr): device addresses are integers here
}

ncclDataType_t nccl_type(ir::DType dt) {
  switch (dt) {
    case ir::DType::F64: return ncclFloat64;
    case ir::DType::BF16: return ncclBfloat16;
    default: return ncclFloat32;
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
    default: return ncclSum;
  }
}

// A device allocation that grows to the largest request.
class Scratch {
 public:
  explicit Scratch(const Cu& cu) : cu_(&cu) {}
  ~Scratch() { reset(); }
  void reset() {
    if (ptr_) cu_->cuMemFree(ptr_);
    ptr_ = 0;
    size_ = 0;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  CUdeviceptr get(std::size_t bytes) {
    if (bytes > size_) {
      if (ptr_) cu_->cuMemFree(ptr_);
      ptr_ = 0;
      cu_->check(cu_->cuMemAlloc(&ptr_, bytes), "cuMemAlloc of the scratch buffer");
      size_ = bytes;
    }
    return ptr_;
  }
  void* as_ptr(std::size_t bytes) { return dev_ptr(get(bytes)); }

 private:
  const Cu* cu_;
  CUdeviceptr ptr_ = 0;
  std::size_t size_ = 0;
};

// Memory from Communicator::allocate_device. Uploads go through the engine's stream, as its collectives do, so
// that a collective started after an upload reads the uploaded bytes. It keeps the engine (its context and
// stream) alive, so it may outlive every Communicator.
class NcclDeviceMemory final : public DeviceMemory {
 public:
  NcclDeviceMemory(std::shared_ptr<const void> engine, const Cu& cu, CUcontext ctx, CUstream stream, std::size_t bytes)
      : engine_(std::move(engine)), cu_(&cu), ctx_(ctx), stream_(stream), bytes_(bytes) {
    cu_->check(cu_->cuCtxSetCurrent(ctx_), "cuCtxSetCurrent");
    if (bytes_)
      cu_->check(cu_->cuMemAlloc(&ptr_, bytes_), "allocate_device: cuMemAlloc of " + std::to_string(bytes_) + " bytes");
  }
  ~NcclDeviceMemory() override {
    if (ptr_ && cu_->cuCtxSetCurrent(ctx_) == CUDA_SUCCESS) cu_->cuMemFree(ptr_);  // from any thread
  }
  NcclDeviceMemory(const NcclDeviceMemory&) = delete;
  NcclDeviceMemory& operator=(const NcclDeviceMemory&) = delete;
  void* data() const override { return dev_ptr(ptr_); }
  std::size_t bytes() const override { return bytes_; }

 protected:
  void copy_in(const std::byte* src, std::size_t offset, std::size_t n) override {
    cu_->check(cu_->cuCtxSetCurrent(ctx_), "cuCtxSetCurrent");
    cu_->check(cu_->cuMemcpyHtoDAsync(ptr_ + offset, src, n, stream_), "DeviceMemory.upload");
    cu_->check(cu_->cuStreamSynchronize(stream_), "DeviceMemory.upload");
  }
  void copy_out(std::byte* dst, std::size_t offset, std::size_t n) const override {
    cu_->check(cu_->cuCtxSetCurrent(ctx_), "cuCtxSetCurrent");
    cu_->check(cu_->cuStreamSynchronize(stream_), "DeviceMemory.download");
    cu_->check(cu_->cuMemcpyDtoH(dst, ptr_ + offset, n), "DeviceMemory.download");
  }

 private:
  std::shared_ptr<const void> engine_;
  const Cu* cu_;
  CUcontext ctx_;
  CUstream stream_;
  std::size_t bytes_;
  CUdeviceptr ptr_ = 0;
};

class NcclEngine final : public Engine, public std::enable_shared_from_this<NcclEngine> {
 public:
  NcclEngine(int rank, int world, int device, const ShareFromRank0& share, std::shared_ptr<void> keep_alive)
      : cu_(Cu::get()),
        nccl_(Nccl::get()),
        rank_(rank),
        world_(world),
        keep_alive_(std::move(keep_alive)),
        send_(cu_),
        recv_(cu_) {
    int count = 0;
    cu_.check(cu_.cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (count == 0) throw Error("distributed: engine nccl: no GPU visible");
    device_ = device % count;
    try {
      runtime::set_gpu(device_);  // this process's CUDA graphs run where its collectives do
    } catch (const Error& e) {
      throw Error("distributed: engine nccl: rank " + std::to_string(rank_) + " runs on GPU " +
                  std::to_string(device_) + ", but " + e.what() +
                  "; create CUDA sessions after distributed::init(), or set CUDA_VISIBLE_DEVICES per rank");
    }
    cu_.check(cu_.cuDeviceGet(&dev_, device_), "cuDeviceGet");
    cu_.check(cu_.cuDevicePrimaryCtxRetain(&ctx_, dev_), "cuDevicePrimaryCtxRetain");
    cu_.check(cu_.cuCtxSetCurrent(ctx_), "cuCtxSetCurrent");
    cu_.check(cu_.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    ncclUniqueId id{};
    if (rank_ == 0) nccl_.check(nccl_.ncclGetUniqueId(&id), "init", rank_);
    if (world_ > 1) {
      if (!share) throw Error("distributed: engine nccl: " + std::to_string(world_) + " ranks need a bootstrap");
      share(std::as_writable_bytes(std::span<ncclUniqueId, 1>(&id, 1)));
    }
    nccl_.check(nccl_.ncclCommInitRank(&comm_, world_, id, rank_), "init", rank_);
  }
  ~NcclEngine() override {
    cu_.cuCtxSetCurrent(ctx_);
    if (comm_) nccl_.ncclCommDestroy(comm_);
    if (stream_) cu_.cuStreamDestroy(stream_);
    send_.reset();
    recv_.reset();
    cu_.cuDevicePrimaryCtxRelease(dev_);
  }
  NcclEngine(const NcclEngine&) = delete;
  NcclEngine& operator=(const NcclEngine&) = delete;

  std::string_view name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  bool rank_ordered_sums() const override { return false; }
  int device() const override { return device_; }
  bool takes_device_memory() const override { return true; }
  std::shared_ptr<DeviceMemory> allocate_device(std::size_t bytes) override {
    return std::make_shared<NcclDeviceMemory>(shared_from_this(), cu_, ctx_, stream_, bytes);
  }

  void all_gather(ConstBuffer in, Buffer out) override {
    collective(in, out, "all_gather", [&](const void* s, void* r) {
      return nccl_.ncclAllGather(s, r, in.count, nccl_type(in.dtype), comm_, stream_);
    });
  }
  void all_reduce(Buffer data, ReduceOp op) override {
    all_reduce_into({data.data, data.count, data.dtype, data.memory}, data, op);  // device memory: in place
  }
  void all_reduce_into(ConstBuffer in, Buffer out, ReduceOp op) override {
    collective(in, out, "all_reduce", [&](const void* s, void* r) {
      return nccl_.ncclAllReduce(s, r, out.count, nccl_type(out.dtype), nccl_op(op), comm_, stream_);
    });
  }
  void reduce_scatter(ConstBuffer in, Buffer out, ReduceOp op) override {
    collective(in, out, "reduce_scatter", [&](const void* s, void* r) {
      return nccl_.ncclReduceScatter(s, r, out.count, nccl_type(out.dtype), nccl_op(op), comm_, stream_);
    });
  }
  void broadcast(Buffer data, int root) override {
    std::lock_guard lock(mutex_);
    void* d = source(data, send_);
    nccl_.check(nccl_.ncclBroadcast(d, d, data.count, nccl_type(data.dtype), root, comm_, stream_), "broadcast", rank_);
    finish(data, d);
  }
  void send(ConstBuffer data, int dst) override {
    std::lock_guard lock(mutex_);
    const void* s = source(data, send_);
    nccl_.check(nccl_.ncclSend(s, data.count, nccl_type(data.dtype), dst, comm_, stream_), "send", rank_);
    cu_.check(cu_.cuStreamSynchronize(stream_), "cuStreamSynchronize");
  }
  void recv(Buffer data, int src) override {
    std::lock_guard lock(mutex_);
    cu_.check(cu_.cuCtxSetCurrent(ctx_), "cuCtxSetCurrent");
    void* r = target(data, recv_);
    nccl_.check(nccl_.ncclRecv(r, data.count, nccl_type(data.dtype), src, comm_, stream_), "recv", rank_);
    finish(data, r);
  }
  void barrier() override {
    float one = 1;
    all_reduce({&one, 1, ir::DType::F32}, ReduceOp::Sum);
  }

 private:
  // One NCCL call from `in` to `out`: host buffers go through the scratch buffers (in through send_, out through
  // recv_), device buffers are handed to NCCL as they are.
  template <class Call>
  void collective(ConstBuffer in, Buffer out, std::string_view what, Call call) {
    std::lock_guard lock(mutex_);
    const void* s = source(in, send_);
    void* r = target(out, recv_);
    nccl_.check(call(s, r), what, rank_);
    finish(out, r);
  }
  // The device address NCCL reads `b` from: its own, or `scratch` after a copy from the host on the stream.
  template <class B>
  auto source(const B& b, Scratch& scratch) -> decltype(b.data) {
    cu_.check(cu_.cuCtxSetCurrent(ctx_), "cuCtxSetCurrent");
    if (b.memory == Memory::Device) return b.data;
    CUdeviceptr s = scratch.get(b.bytes());
    cu_.check(cu_.cuMemcpyHtoDAsync(s, b.data, b.bytes(), stream_), "cuMemcpyHtoDAsync");
    return dev_ptr(s);
  }
  // The device address NCCL writes `out` to: its own, or `scratch`, copied back by finish().
  static void* target(Buffer out, Scratch& scratch) {
    return out.memory == Memory::Device ? out.data : scratch.as_ptr(out.bytes());
  }
  // Waits for the collective, and copies a host buffer's result back from `dev`.
  void finish(Buffer out, const void* dev) {
    cu_.check(cu_.cuStreamSynchronize(stream_), "cuStreamSynchronize");
    if (out.memory == Memory::Host)
      cu_.check(cu_.cuMemcpyDtoH(out.data, reinterpret_cast<CUdeviceptr>(dev), out.bytes()), "cuMemcpyDtoH");
  }

  const Cu& cu_;
  const Nccl& nccl_;
  int rank_, world_, device_ = 0;
  std::shared_ptr<void> keep_alive_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUstream stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  std::mutex mutex_;
  Scratch send_, recv_;
};

}  // namespace

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes);

std::shared_ptr<Engine> make_nccl_engine(int rank, int world_size, int device, const ShareFromRank0& share,
                                         std::shared_ptr<void> keep_alive) {
  return std::make_shared<NcclEngine>(rank, world_size, device, share, std::move(keep_alive));
}

std::string nccl_unavailable_reason() {
  try {
    Nccl::get();
    Cu::get();
    return {};
  } catch (const Error& e) {
    return e.what();
  }
}
#else
std::shared_ptr<Engine> make_nccl_engine(int, int, int, const ShareFromRank0&, std::shared_ptr<void>) {
  throw Error("distributed: engine nccl: " + nccl_unavailable_reason());
}
std::string nccl_unavailable_reason() {
  return "RLX was built without NCCL support (nccl.h and the CUDA toolkit's cuda.h were not found at build time)";
}
#endif

ShareFromRank0 nccl_id_through_store(std::shared_ptr<TcpStore> store) {
  return [store = std::move(store)](std::span<std::byte> id) {
    if (id.size() != kNcclUniqueIdBytes)
      throw Error(store->context() + ": NCCL's unique id is " + std::to_string(kNcclUniqueIdBytes) + " bytes, not " +
                  std::to_string(id.size()));
    share_from_rank0(*store, "rlx/nccl/unique_id", id);
  };
}

}  // namespace rlx::distributed::detail
