#pragma once
// Collectives between processes (ranks), as MLX's `distributed` does: one
// interface, Communicator, with engines behind it:
//   local  world size 1, always available;
//   mpi    OpenMPI, for CPU processes started by mpirun;
//   tcp    RLX's own, for CPU processes started by a launcher that sets
//          RANK/WORLD_SIZE (torchrun style): ranks meet through a TCP store
//          on MASTER_ADDR:MASTER_PORT and connect a mesh of TCP connections;
//   nccl   NVIDIA's NCCL, loaded with dlopen (libnccl.so.2), one GPU per rank:
//          on buffers in that GPU's memory directly, and on host buffers
//          staged through it.
// Every sum over ranks that the MPI, tcp and local engines compute is taken in rank
// order (each rank gathers every contribution and adds rank 0's, then rank
// 1's, ...), so a run is bit-reproducible and equals a single process adding
// the same parts in the same order. docs/distributed.md describes it.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "rlx/ir/dtype.hpp"
#include "rlx/ir/tensor.hpp"

namespace rlx::distributed {

enum class ReduceOp { Sum, Max, Min };
std::string_view reduce_op_name(ReduceOp op);

enum class EngineKind { Auto, Local, Mpi, Tcp, Nccl };
std::string_view engine_name(EngineKind kind);
// "auto", "local", "mpi", "tcp" or "nccl"; throws rlx::Error naming `field` otherwise.
EngineKind parse_engine(std::string_view text, std::string_view field = "engine");

// Where a buffer's bytes are. Device: memory on this rank's GPU (Communicator::device()), a CUDA device
// address in that GPU's primary context, such as DeviceMemory::data() or a CUDA backend handle's address
// (CompiledGraph::handle_address). Only engines that say so take it (Communicator::takes_device_memory); the
// work that wrote it must have finished (a CompiledGraph run has, when it returns).
enum class Memory { Host, Device };
std::string_view memory_name(Memory m);  // "host", "device"

// A typed run of elements: what every collective moves.
// Element types: f32, f64 and bf16 (bf16 sums are taken in f32, then rounded once).
struct Buffer {
  void* data = nullptr;
  std::size_t count = 0;  // elements
  ir::DType dtype = ir::DType::F32;
  Memory memory = Memory::Host;
  std::size_t bytes() const { return count * ir::dtype_size(dtype); }
};
struct ConstBuffer {
  const void* data = nullptr;
  std::size_t count = 0;
  ir::DType dtype = ir::DType::F32;
  Memory memory = Memory::Host;
  std::size_t bytes() const { return count * ir::dtype_size(dtype); }
};

// Memory on the GPU of this rank, from Communicator::allocate_device: what a collective on device memory reads
// and writes without staging, as PyTorch's CUDA tensors are for torch.distributed. Freed with the last holder.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual void* data() const = 0;  // the device address
  virtual std::size_t bytes() const = 0;
  // Host to device and back, `src.size()` / `dst.size()` bytes at byte `offset`; rlx::Error naming the range
  // when it does not fit.
  void upload(std::span<const std::byte> src, std::size_t offset = 0);
  void download(std::span<std::byte> dst, std::size_t offset = 0) const;
  // A view of elements [first, first + count) as a collective's buffer; rlx::Error when they do not fit.
  Buffer buffer(ir::DType dtype, std::size_t count, std::size_t first = 0);
  ConstBuffer const_buffer(ir::DType dtype, std::size_t count, std::size_t first = 0) const;

 protected:
  virtual void copy_in(const std::byte* src, std::size_t offset, std::size_t bytes) = 0;
  virtual void copy_out(std::byte* dst, std::size_t offset, std::size_t bytes) const = 0;

 private:
  void check_range(std::string_view what, std::size_t offset, std::size_t bytes) const;
  void check_elements(std::string_view what, ir::DType dtype, std::size_t count, std::size_t first) const;
};

// What an engine implements. Arguments arrive checked by Communicator (sizes,
// ranks, dtypes), so an engine only moves bytes. Engines may be implemented
// outside RLX and wrapped with Communicator(std::shared_ptr<Engine>).
class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // out = every rank's `in`, concatenated in rank order (out.count = in.count * world_size).
  virtual void all_gather(ConstBuffer in, Buffer out) = 0;
  // In place. The default gathers every rank's data and reduces it in rank order; beyond 2 ranks, a message of
  // kSplitAllReduceBytes or more goes through reduce_scatter then all_gather (the same rank-ordered sums).
  virtual void all_reduce(Buffer data, ReduceOp op);
  // out = the op over every rank's `in` (same count, dtype and memory; not overlapping). The default copies host
  // memory into out and reduces it in place; an engine that takes device memory overrides it.
  virtual void all_reduce_into(ConstBuffer in, Buffer out, ReduceOp op);
  // out = the op over ranks of chunk `rank` of `in` (in.count = out.count * world_size). The default gathers.
  virtual void reduce_scatter(ConstBuffer in, Buffer out, ReduceOp op);
  virtual void broadcast(Buffer data, int root) = 0;
  virtual void send(ConstBuffer data, int dst) = 0;
  virtual void recv(Buffer data, int src) = 0;
  virtual void barrier() = 0;
  // True when the engine's sums are taken in rank order (the default all_reduce and reduce_scatter).
  virtual bool rank_ordered_sums() const { return true; }
  // Device memory: the GPU this rank runs on (-1: none), whether every collective also takes Memory::Device
  // buffers there, and memory there. The defaults: no GPU; allocate_device is never reached.
  virtual int device() const { return -1; }
  virtual bool takes_device_memory() const { return false; }
  virtual std::shared_ptr<DeviceMemory> allocate_device(std::size_t bytes);
};

// From this size on, an all_reduce among more than 2 ranks is a reduce-scatter then an all-gather (Engine's
// default, and the tcp engine's): two exchanges of 2 (W - 1) / W of the message, not one of (W - 1) times it.
inline constexpr std::size_t kSplitAllReduceBytes = std::size_t(64) << 10;
inline bool splits_all_reduce(int world_size, std::size_t bytes) {
  return world_size > 2 && bytes >= kSplitAllReduceBytes;
}

// out = op over `parts` (world contiguous chunks of out.count elements each, in `in`), taken in chunk order:
// ((p0 op p1) op p2) ... The reduction every rank-ordered engine uses.
void reduce_in_order(ConstBuffer in, int parts, Buffer out, ReduceOp op);

// A group of ranks and the engine that connects them; a cheap value (shared engine).
class Communicator {
 public:
  explicit Communicator(std::shared_ptr<Engine> engine);

  int rank() const { return engine_->rank(); }
  int world_size() const { return engine_->world_size(); }
  std::string_view engine() const { return engine_->name(); }
  bool rank_ordered_sums() const { return engine_->rank_ordered_sums(); }
  // The GPU of this rank (-1: the engine has none), and whether collectives take buffers in its memory
  // (Memory::Device) directly: nccl's do, with no copy through the host.
  int device() const { return engine_->device(); }
  bool takes_device_memory() const { return engine_->takes_device_memory(); }
  // `bytes` of memory on device(); rlx::Error, naming the engine, where collectives take host memory only.
  std::shared_ptr<DeviceMemory> allocate_device(std::size_t bytes);

  // Each throws rlx::Error naming the collective, the field and the rank on a size, rank, dtype or memory that
  // does not fit (a device buffer on an engine that takes host memory only; in and out in different memories).
  void all_reduce(Buffer data, ReduceOp op = ReduceOp::Sum);
  // Out of place: `out` gets the op over every rank's `in` and `in` is left as it was, as ncclAllReduce with two
  // buffers does. Between two CUDA handles (CompiledGraph::handle_address) it hands one graph's output to the
  // next graph's input on the GPU: the tensor-parallel encoder in docs/distributed.md.
  void all_reduce(ConstBuffer in, Buffer out, ReduceOp op = ReduceOp::Sum);
  void all_gather(ConstBuffer in, Buffer out);
  void reduce_scatter(ConstBuffer in, Buffer out, ReduceOp op = ReduceOp::Sum);
  void broadcast(Buffer data, int root = 0);
  void send(ConstBuffer data, int dst);
  void recv(Buffer data, int src);
  void barrier();

  // Typed conveniences.
  void all_reduce(std::span<float> data, ReduceOp op = ReduceOp::Sum) { all_reduce(buf(data), op); }
  void all_reduce(std::span<double> data, ReduceOp op = ReduceOp::Sum) { all_reduce(buf(data), op); }
  void all_reduce(ir::Tensor& t, ReduceOp op = ReduceOp::Sum);
  void all_gather(std::span<const float> in, std::span<float> out) { all_gather(cbuf(in), buf(out)); }
  void all_gather(std::span<const double> in, std::span<double> out) { all_gather(cbuf(in), buf(out)); }
  void reduce_scatter(std::span<const float> in, std::span<float> out, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter(cbuf(in), buf(out), op);
  }
  void broadcast(std::span<float> data, int root = 0) { broadcast(buf(data), root); }
  void broadcast(std::span<double> data, int root = 0) { broadcast(buf(data), root); }
  void broadcast(ir::Tensor& t, int root = 0);
  void send(std::span<const float> data, int dst) { send(cbuf(data), dst); }
  void recv(std::span<float> data, int src) { recv(buf(data), src); }

 private:
  static Buffer buf(std::span<float> s) { return {s.data(), s.size(), ir::DType::F32}; }
  static Buffer buf(std::span<double> s) { return {s.data(), s.size(), ir::DType::F64}; }
  static ConstBuffer cbuf(std::span<const float> s) { return {s.data(), s.size(), ir::DType::F32}; }
  static ConstBuffer cbuf(std::span<const double> s) { return {s.data(), s.size(), ir::DType::F64}; }
  void check_rank(int r, std::string_view op, std::string_view field) const;

  std::shared_ptr<Engine> engine_;
};

struct InitOptions {
  // Auto: RLX_DISTRIBUTED if set, else mpi when mpirun started the process (OMPI_COMM_WORLD_SIZE), else tcp when
  // RANK/WORLD_SIZE say more than one rank, else local.
  EngineKind engine = EngineKind::Auto;
  // nccl: the GPU of this rank; -1: LOCAL_RANK (or OMPI_COMM_WORLD_LOCAL_RANK) modulo the GPUs visible.
  int device = -1;
};

// The world communicator of this process, created on the first call (MPI is initialised then, and finalised
// at exit); later calls return the same group and throw if `options` ask for another engine. Throws rlx::Error
// saying why when the engine asked for is not usable (not built, library missing, launcher variables that
// disagree with it).
Communicator init(const InitOptions& options = {});
bool is_initialized();
// The world communicator; init() with the defaults when none exists yet.
Communicator world();

// Whether each engine is usable in this process, and why not (empty: usable). Does not initialise anything
// except loading a library.
std::string engine_unavailable_reason(EngineKind kind);

// The engines themselves, for tests and for hosts that manage their own processes.
std::shared_ptr<Engine> make_local_engine();

// The tcp engine's rendezvous: init() fills it from MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and
// RLX_DISTRIBUTED_TIMEOUT.
struct TcpOptions {
  std::string master_addr = "127.0.0.1";  // rank 0 serves the store here; an IPv4 address or a host name
  int master_port = 29500;
  int rank = 0;
  int world_size = 1;
  // How long the ranks may take to meet, and the longest a collective waits for a peer (one that exits is
  // reported at once: its connections close).
  std::chrono::milliseconds timeout{600'000};
};
// Joins the other ranks (blocks until all world_size have met, or throws rlx::Error naming the address, the
// rank and the time waited). World size 1 opens no socket.
std::shared_ptr<Engine> make_tcp_engine(const TcpOptions& options);

}  // namespace rlx::distributed
