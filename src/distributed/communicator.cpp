// Communicator's checks, the rank-ordered reduction every engine shares, the
// world-size-1 engine, and init(), which picks an engine from the launcher's
// variables.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <vector>

#include "distributed/engines.hpp"
#include "distributed/tcp_store.hpp"
#include "rlx/distributed/distributed.hpp"
#include "rlx/env.hpp"
#include "rlx/error.hpp"

namespace rlx::distributed {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

std::string_view engine_name(EngineKind kind) {
  switch (kind) {
    case EngineKind::Auto: return "auto";
    case EngineKind::Local: return "local";
    case EngineKind::Mpi: return "mpi";
    case EngineKind::Tcp: return "tcp";
    case EngineKind::Nccl: return "nccl";
  }
  return "?";
}

std::string_view memory_name(Memory m) { return m == Memory::Device ? "device" : "host"; }

EngineKind parse_engine(std::string_view text, std::string_view field) {
  for (EngineKind k : {EngineKind::Auto, EngineKind::Local, EngineKind::Mpi, EngineKind::Tcp, EngineKind::Nccl})
    if (text == engine_name(k)) return k;
  throw Error("distributed: " + std::string(field) + " '" + std::string(text) +
              "' is not an engine (auto, local, mpi, tcp, nccl)");
}

namespace {

bool supported(ir::DType dt) { return dt == ir::DType::F32 || dt == ir::DType::F64 || dt == ir::DType::BF16; }

template <class T, class Combine>
void reduce_typed(const T* in, std::size_t count, int parts, T* out, Combine combine) {
  std::copy(in, in + count, out);  // part 0
  for (int p = 1; p < parts; ++p) {
    const T* src = in + static_cast<std::size_t>(p) * count;
    for (std::size_t i = 0; i < count; ++i) out[i] = combine(out[i], src[i]);
  }
}

template <class T>
void reduce_op(const T* in, std::size_t count, int parts, T* out, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return reduce_typed(in, count, parts, out, [](T a, T b) { return a + b; });
    case ReduceOp::Max: return reduce_typed(in, count, parts, out, [](T a, T b) { return b > a ? b : a; });
    case ReduceOp::Min: return reduce_typed(in, count, parts, out, [](T a, T b) { return b < a ? b : a; });
  }
}

}  // namespace

void reduce_in_order(ConstBuffer in, int parts, Buffer out, ReduceOp op) {
  if (in.dtype != out.dtype || in.count != out.count * static_cast<std::size_t>(parts))
    throw Error("distributed.reduce_in_order: " + std::to_string(in.count) + " " +
                std::string(ir::dtype_name(in.dtype)) + " elements are not " + std::to_string(parts) + " parts of " +
                std::to_string(out.count) + " " + std::string(ir::dtype_name(out.dtype)));
  switch (out.dtype) {
    case ir::DType::F32:
      return reduce_op(static_cast<const float*>(in.data), out.count, parts, static_cast<float*>(out.data), op);
    case ir::DType::F64:
      return reduce_op(static_cast<const double*>(in.data), out.count, parts, static_cast<double*>(out.data), op);
    case ir::DType::BF16: {
      // Widened to f32 (exact), reduced in the same order, rounded once: a block of every part at a time, so the
      // f32 copies stay in cache and nothing the size of the message is allocated.
      constexpr std::size_t kBlock = 4096;
      const auto* src = static_cast<const std::uint16_t*>(in.data);
      auto* dst = static_cast<std::uint16_t*>(out.data);
      std::vector<float> wide(static_cast<std::size_t>(parts) * kBlock), acc(kBlock);
      for (std::size_t b = 0; b < out.count; b += kBlock) {
        const std::size_t n = std::min(kBlock, out.count - b);
        for (std::size_t p = 0; p < static_cast<std::size_t>(parts); ++p)
          for (std::size_t i = 0; i < n; ++i) wide[p * n + i] = ir::bf16_to_float(src[p * out.count + b + i]);
        reduce_op(wide.data(), n, parts, acc.data(), op);
        for (std::size_t i = 0; i < n; ++i) dst[b + i] = ir::float_to_bf16(acc[i]);
      }
      return;
    }
    default:
      throw Error("distributed.reduce_in_order: dtype " + std::string(ir::dtype_name(out.dtype)) +
                  " is not supported (f32, f64, bf16)");
  }
}

void Engine::all_reduce(Buffer data, ReduceOp op) {
  const auto world = static_cast<std::size_t>(world_size());
  // Beyond 2 ranks, a large message goes through reduce_scatter (chunk r of every rank's data, reduced in rank
  // order by rank r) and all_gather: the same sums as gathering everything, with 2 (W - 1) / W of the message moved
  // each way by an engine whose reduce_scatter sends each rank its chunk only (MPI's: MPI_Alltoall).
  const std::size_t chunk = data.count / world, esize = ir::dtype_size(data.dtype);
  if (splits_all_reduce(world_size(), data.bytes())) {
    auto* base = static_cast<std::byte*>(data.data);
    std::byte* mine = base + static_cast<std::size_t>(rank()) * chunk * esize;
    reduce_scatter({data.data, chunk * world, data.dtype}, {mine, chunk, data.dtype}, op);
    const std::vector<std::byte> reduced(mine, mine + chunk * esize);  // all_gather's input may not alias its output
    all_gather({reduced.data(), chunk, data.dtype}, {data.data, chunk * world, data.dtype});
    if (const std::size_t rest = data.count - chunk * world; rest > 0)  // fewer than W elements: gathered whole
      Engine::all_reduce({base + chunk * world * esize, rest, data.dtype}, op);
    return;
  }
  std::vector<std::byte> gathered(data.bytes() * world);
  all_gather({data.data, data.count, data.dtype}, {gathered.data(), data.count * world, data.dtype});
  reduce_in_order({gathered.data(), gathered.size() / ir::dtype_size(data.dtype), data.dtype}, world_size(), data, op);
}

void Engine::all_reduce_into(ConstBuffer in, Buffer out, ReduceOp op) {
  if (in.memory == Memory::Device)
    throw Error("distributed.all_reduce: engine " + std::string(name()) +
                " takes device memory but does not reduce it out of place (Engine::all_reduce_into)");
  std::memcpy(out.data, in.data, out.bytes());
  all_reduce(out, op);
}

void Engine::reduce_scatter(ConstBuffer in, Buffer out, ReduceOp op) {
  const auto world = static_cast<std::size_t>(world_size());
  std::vector<std::byte> gathered(in.bytes() * world);
  all_gather(in, {gathered.data(), in.count * world, in.dtype});
  // Chunk `rank` of every rank's contribution, in rank order.
  std::vector<std::byte> mine(out.bytes() * world);
  for (std::size_t r = 0; r < world; ++r)
    std::memcpy(mine.data() + r * out.bytes(), gathered.data() + r * in.bytes() + rank() * out.bytes(), out.bytes());
  reduce_in_order({mine.data(), out.count * world, out.dtype}, world_size(), out, op);
}

std::shared_ptr<DeviceMemory> Engine::allocate_device(std::size_t) {
  throw Error("distributed.allocate_device: engine " + std::string(name()) + " has no device memory");
}

// ---- DeviceMemory ----

void DeviceMemory::check_range(std::string_view what, std::size_t offset, std::size_t nbytes) const {
  if (offset > bytes() || nbytes > bytes() - offset)
    throw Error("distributed.DeviceMemory." + std::string(what) + ": bytes [" + std::to_string(offset) + ", " +
                std::to_string(offset) + " + " + std::to_string(nbytes) + ") are outside the " +
                std::to_string(bytes()) + " bytes allocated");
}

void DeviceMemory::upload(std::span<const std::byte> src, std::size_t offset) {
  check_range("upload", offset, src.size());
  if (!src.empty()) copy_in(src.data(), offset, src.size());
}

void DeviceMemory::download(std::span<std::byte> dst, std::size_t offset) const {
  check_range("download", offset, dst.size());
  if (!dst.empty()) copy_out(dst.data(), offset, dst.size());
}

void DeviceMemory::check_elements(std::string_view what, ir::DType dtype, std::size_t count, std::size_t first) const {
  const std::size_t size = ir::dtype_size(dtype), fit = bytes() / size;
  if (count > fit || first > fit - count)  // no product that could wrap around
    throw Error("distributed.DeviceMemory." + std::string(what) + ": " + std::string(ir::dtype_name(dtype)) +
                " elements [" + std::to_string(first) + ", " + std::to_string(first) + " + " + std::to_string(count) +
                ") do not fit the " + std::to_string(bytes()) + " bytes allocated");
}

Buffer DeviceMemory::buffer(ir::DType dtype, std::size_t count, std::size_t first) {
  check_elements("buffer", dtype, count, first);
  return {static_cast<std::byte*>(data()) + first * ir::dtype_size(dtype), count, dtype, Memory::Device};
}

ConstBuffer DeviceMemory::const_buffer(ir::DType dtype, std::size_t count, std::size_t first) const {
  check_elements("const_buffer", dtype, count, first);
  return {static_cast<const std::byte*>(data()) + first * ir::dtype_size(dtype), count, dtype, Memory::Device};
}

// ---- Communicator ----

Communicator::Communicator(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {
  if (!engine_) throw Error("distributed.Communicator: no engine");
}

namespace {

std::string at(const Communicator& c) {
  return " (rank " + std::to_string(c.rank()) + " of " + std::to_string(c.world_size()) + ", engine " +
         std::string(c.engine()) + ")";
}

template <class B>
void check_buffer(const Communicator& c, const B& b, std::string_view op, std::string_view field) {
  if (!supported(b.dtype))
    throw Error("distributed." + std::string(op) + ": " + std::string(field) + " has dtype " +
                std::string(ir::dtype_name(b.dtype)) + "; collectives move f32, f64 and bf16" + at(c));
  if (b.count > 0 && b.data == nullptr)
    throw Error("distributed." + std::string(op) + ": " + std::string(field) + " is null with " +
                std::to_string(b.count) + " elements" + at(c));
  if (b.memory == Memory::Device && !c.takes_device_memory())
    throw Error("distributed." + std::string(op) + ": " + std::string(field) + " is in device memory, but engine " +
                std::string(c.engine()) + " takes host memory only (the nccl engine takes both)" + at(c));
}

template <class In, class Out>
void check_same_kind(const Communicator& c, const In& in, const Out& out, std::string_view op) {
  if (in.dtype != out.dtype)
    throw Error("distributed." + std::string(op) + ": in is " + std::string(ir::dtype_name(in.dtype)) + " but out is " +
                std::string(ir::dtype_name(out.dtype)) + at(c));
  if (in.memory != out.memory)
    throw Error("distributed." + std::string(op) + ": in is in " + std::string(memory_name(in.memory)) +
                " memory but out is in " + std::string(memory_name(out.memory)) + " memory" + at(c));
}

}  // namespace

void Communicator::check_rank(int r, std::string_view op, std::string_view field) const {
  if (r < 0 || r >= world_size())
    throw Error("distributed." + std::string(op) + ": " + std::string(field) + " " + std::to_string(r) +
                " is not a rank of the group" + at(*this));
}

void Communicator::all_reduce(Buffer data, ReduceOp op) {
  check_buffer(*this, data, "all_reduce", "data");
  if (data.count > 0) engine_->all_reduce(data, op);
}

void Communicator::all_reduce(ConstBuffer in, Buffer out, ReduceOp op) {
  check_buffer(*this, in, "all_reduce", "in");
  check_buffer(*this, out, "all_reduce", "out");
  check_same_kind(*this, in, out, "all_reduce");
  if (in.count != out.count)
    throw Error("distributed.all_reduce: in has " + std::to_string(in.count) + " elements but out has " +
                std::to_string(out.count) + at(*this));
  if (in.count == 0) return;
  const auto a = reinterpret_cast<std::uintptr_t>(in.data), b = reinterpret_cast<std::uintptr_t>(out.data);
  if (a == b) return engine_->all_reduce(out, op);  // the same buffer: in place
  if (a < b + out.bytes() && b < a + in.bytes())
    throw Error("distributed.all_reduce: in and out overlap without being the same buffer" + at(*this));
  engine_->all_reduce_into(in, out, op);
}

void Communicator::all_reduce(ir::Tensor& t, ReduceOp op) {
  all_reduce(Buffer{t.data(), static_cast<std::size_t>(t.numel()), t.dtype()}, op);
}

void Communicator::all_gather(ConstBuffer in, Buffer out) {
  check_buffer(*this, in, "all_gather", "in");
  check_buffer(*this, out, "all_gather", "out");
  check_same_kind(*this, in, out, "all_gather");
  if (out.count != in.count * static_cast<std::size_t>(world_size()))
    throw Error("distributed.all_gather: out has " + std::to_string(out.count) + " elements, not in's " +
                std::to_string(in.count) + " times the world size" + at(*this));
  if (in.count > 0) engine_->all_gather(in, out);
}

void Communicator::reduce_scatter(ConstBuffer in, Buffer out, ReduceOp op) {
  check_buffer(*this, in, "reduce_scatter", "in");
  check_buffer(*this, out, "reduce_scatter", "out");
  check_same_kind(*this, in, out, "reduce_scatter");
  if (in.count != out.count * static_cast<std::size_t>(world_size()))
    throw Error("distributed.reduce_scatter: in has " + std::to_string(in.count) + " elements, not out's " +
                std::to_string(out.count) + " times the world size" + at(*this));
  if (out.count > 0) engine_->reduce_scatter(in, out, op);
}

void Communicator::broadcast(Buffer data, int root) {
  check_buffer(*this, data, "broadcast", "data");
  check_rank(root, "broadcast", "root");
  if (data.count > 0) engine_->broadcast(data, root);
}

void Communicator::broadcast(ir::Tensor& t, int root) {
  broadcast(Buffer{t.data(), static_cast<std::size_t>(t.numel()), t.dtype()}, root);
}

void Communicator::send(ConstBuffer data, int dst) {
  check_buffer(*this, data, "send", "data");
  check_rank(dst, "send", "dst");
  if (dst == rank()) throw Error("distributed.send: dst is this rank; a rank cannot send to itself" + at(*this));
  engine_->send(data, dst);
}

void Communicator::recv(Buffer data, int src) {
  check_buffer(*this, data, "recv", "data");
  check_rank(src, "recv", "src");
  if (src == rank()) throw Error("distributed.recv: src is this rank; a rank cannot receive from itself" + at(*this));
  engine_->recv(data, src);
}

void Communicator::barrier() { engine_->barrier(); }

std::shared_ptr<DeviceMemory> Communicator::allocate_device(std::size_t bytes) {
  if (!takes_device_memory())
    throw Error("distributed.allocate_device: engine " + std::string(engine()) +
                " takes host memory only; device memory needs the nccl engine" + at(*this));
  return engine_->allocate_device(bytes);
}

// ---- the world-size-1 engine ----

namespace {

class LocalEngine final : public Engine {
 public:
  std::string_view name() const override { return "local"; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void all_gather(ConstBuffer in, Buffer out) override { std::memmove(out.data, in.data, in.bytes()); }
  void all_reduce(Buffer, ReduceOp) override {}
  void reduce_scatter(ConstBuffer in, Buffer out, ReduceOp) override { std::memmove(out.data, in.data, out.bytes()); }
  void broadcast(Buffer, int) override {}
  // Communicator refuses every peer before these are reached: the only rank is this one.
  void send(ConstBuffer, int dst) override { throw Error("distributed.send: no rank " + std::to_string(dst)); }
  void recv(Buffer, int src) override { throw Error("distributed.recv: no rank " + std::to_string(src)); }
  void barrier() override {}
};

std::optional<long long> env_int(std::string_view name) { return env::get_int(name); }

// The launcher's view: (rank, world size) from mpirun's or torchrun-style variables; nullopt when neither is set.
struct Launch {
  std::string source;  // "mpirun" or "RANK/WORLD_SIZE"
  int rank = 0;
  int world = 1;
};
// mpirun's variables are trusted (MPI checks them itself); a torchrun-style launcher's are checked here, since
// the tcp engine builds the world from them alone.
std::optional<Launch> launch_from_env() {
  if (auto size = env_int("OMPI_COMM_WORLD_SIZE"))
    return Launch{"mpirun", static_cast<int>(env_int("OMPI_COMM_WORLD_RANK").value_or(0)), static_cast<int>(*size)};
  const auto size = env_int("WORLD_SIZE");
  auto rank = env_int("RANK");
  if (!size) {
    if (rank && *rank != 0)
      throw Error("distributed.init: RANK is " + std::to_string(*rank) +
                  " but WORLD_SIZE is unset; a launcher sets both (or neither, for one process)");
    return std::nullopt;
  }
  if (*size < 1 || *size > INT_MAX)
    throw Error("distributed.init: WORLD_SIZE is " + std::to_string(*size) + "; a world has 1 rank or more");
  if (!rank) {
    if (*size > 1)
      throw Error("distributed.init: WORLD_SIZE is " + std::to_string(*size) +
                  " but RANK is unset; a launcher sets both (RANK: 0 to " + std::to_string(*size - 1) + ")");
    rank = 0;
  }
  if (*rank < 0 || *rank >= *size)
    throw Error("distributed.init: RANK is " + std::to_string(*rank) + " but WORLD_SIZE is " + std::to_string(*size) +
                " (ranks are 0 to " + std::to_string(*size - 1) + ")");
  return Launch{"RANK/WORLD_SIZE", static_cast<int>(*rank), static_cast<int>(*size)};
}

// The rendezvous of the tcp engine (and of nccl without mpirun): MASTER_ADDR, the port, RLX_DISTRIBUTED_TIMEOUT.
// The port is RLX_DISTRIBUTED_PORT when set, else MASTER_PORT, except under torchrun's agent store
// (TORCHELASTIC_USE_AGENT_STORE=True), whose own TCPStore already listens on MASTER_PORT: then MASTER_PORT + 1.
TcpOptions tcp_options_from_env(const std::optional<Launch>& launch) {
  TcpOptions o;
  if (launch) {
    o.rank = launch->rank;
    o.world_size = launch->world;
  }
  o.master_addr = env::get("MASTER_ADDR").value_or(o.master_addr);
  const auto check_port = [](std::string_view name, long long port) {
    if (port < 1 || port > 65535)
      throw Error("distributed.init: " + std::string(name) + " is " + std::to_string(port) +
                  ", not a TCP port (1 to 65535)");
    return static_cast<int>(port);
  };
  if (auto port = env_int("RLX_DISTRIBUTED_PORT")) {
    o.master_port = check_port("RLX_DISTRIBUTED_PORT", *port);
  } else {
    o.master_port = check_port("MASTER_PORT", env_int("MASTER_PORT").value_or(o.master_port));
    if (env::get("TORCHELASTIC_USE_AGENT_STORE") == "True")
      o.master_port = check_port("MASTER_PORT + 1", o.master_port + 1LL);
  }
  const long long seconds = env_int("RLX_DISTRIBUTED_TIMEOUT").value_or(600);
  if (seconds < 1 || seconds > 1'000'000'000)
    throw Error("distributed.init: RLX_DISTRIBUTED_TIMEOUT is " + std::to_string(seconds) +
                "; it is a number of seconds, 1 or more");
  o.timeout = std::chrono::seconds(seconds);
  return o;
}

int local_rank_from_env() {
  if (auto r = env_int("LOCAL_RANK")) return static_cast<int>(*r);
  if (auto r = env_int("OMPI_COMM_WORLD_LOCAL_RANK")) return static_cast<int>(*r);
  return 0;
}

std::mutex g_mutex;
std::shared_ptr<Engine> g_world;  // destroyed at exit: MPI is finalised then
EngineKind g_kind = EngineKind::Auto;

std::shared_ptr<Engine> create(EngineKind kind, const InitOptions& options, const std::optional<Launch>& launch) {
  const auto disagree = [&](const Engine& e) {
    if (launch && (launch->world != e.world_size() || launch->rank != e.rank()))
      throw Error("distributed.init: " + launch->source + " says rank " + std::to_string(launch->rank) + " of " +
                  std::to_string(launch->world) + ", but the " + std::string(e.name()) + " engine sees rank " +
                  std::to_string(e.rank()) + " of " + std::to_string(e.world_size()) +
                  (kind == EngineKind::Mpi ? " (start the ranks with mpirun)" : ""));
  };
  switch (kind) {
    case EngineKind::Local: {
      auto e = make_local_engine();
      disagree(*e);
      return e;
    }
    case EngineKind::Mpi: {
      auto e = detail::make_mpi_engine();
      disagree(*e);
      return e;
    }
    case EngineKind::Tcp: {
      auto e = make_tcp_engine(tcp_options_from_env(launch));
      disagree(*e);
      return e;
    }
    case EngineKind::Nccl: {
      const int world = launch ? launch->world : 1, rank = launch ? launch->rank : 0;
      const int device = options.device >= 0 ? options.device : local_rank_from_env();
      if (world == 1) return detail::make_nccl_engine(rank, world, device, {}, nullptr);
      if (launch->source == "mpirun") {
        // Rank 0's unique id travels over MPI; the MPI engine lives as long as the NCCL one.
        auto mpi = detail::make_mpi_engine();
        disagree(*mpi);
        return detail::make_nccl_engine(
            rank, world, device,
            [mpi](std::span<std::byte> id) {
              mpi->broadcast({id.data(), id.size(), ir::DType::U8}, 0);
            },
            mpi);
      }
      // Said before the store is joined, where the other ranks would only see this one never arrive.
      if (auto why = detail::nccl_unavailable_reason(); !why.empty()) throw Error(why);
      // RANK/WORLD_SIZE: through the TCP store, which is let go once NCCL's communicator exists (creating it is
      // collective, so every rank has read the id by then).
      const TcpOptions o = tcp_options_from_env(launch);
      auto store = std::make_shared<detail::TcpStore>(
          detail::StoreOptions{o.master_addr, o.master_port, o.rank, o.world_size, o.timeout});
      return detail::make_nccl_engine(rank, world, device, detail::nccl_id_through_store(std::move(store)), nullptr);
    }
    case EngineKind::Auto: break;
  }
  throw Error("distributed.init: no engine chosen");
}

}  // namespace

std::shared_ptr<Engine> make_local_engine() { return std::make_shared<LocalEngine>(); }

Communicator init(const InitOptions& options) {
  EngineKind kind = options.engine;
  if (kind == EngineKind::Auto)
    if (auto v = env::get("RLX_DISTRIBUTED")) kind = parse_engine(*v, "RLX_DISTRIBUTED");
  const auto launch = launch_from_env();
  if (kind == EngineKind::Auto) {
    if (launch && launch->source == "mpirun") {
      kind = EngineKind::Mpi;
    } else if (launch && launch->world > 1) {
      kind = EngineKind::Tcp;  // RLX's own rendezvous on MASTER_ADDR:MASTER_PORT
    } else {
      kind = EngineKind::Local;
    }
  }
  std::lock_guard lock(g_mutex);
  if (g_world) {
    if (options.engine != EngineKind::Auto && kind != g_kind)
      throw Error("distributed.init: already initialised with engine " + std::string(engine_name(g_kind)) +
                  ", asked for " + std::string(engine_name(kind)));
    return Communicator(g_world);
  }
  g_world = create(kind, options, launch);
  g_kind = kind;
  return Communicator(g_world);
}

bool is_initialized() {
  std::lock_guard lock(g_mutex);
  return g_world != nullptr;
}

Communicator world() {
  {
    std::lock_guard lock(g_mutex);
    if (g_world) return Communicator(g_world);
  }
  return init();
}

std::string engine_unavailable_reason(EngineKind kind) {
  switch (kind) {
    case EngineKind::Mpi: return detail::mpi_unavailable_reason();
    case EngineKind::Nccl: return detail::nccl_unavailable_reason();
    default: return {};
  }
}

}  // namespace rlx::distributed
