// The MPI engine: OpenMPI (Debian's libopenmpi-dev, found by CMake's FindMPI)
// for CPU processes started by mpirun. Collectives move bytes (MPI_BYTE);
// sums are never MPI_SUM, whose order MPI leaves unspecified: all_reduce
// gathers every rank's data (MPI_Allgather) and reduce_scatter each rank's
// chunk (MPI_Alltoall), and each rank adds them in rank order itself.
#include "distributed/engines.hpp"
#include "rlx/error.hpp"

#ifdef RLX_HAVE_MPI
#include <mpi.h>

#include <climits>
#include <vector>
#endif

namespace rlx::distributed::detail {

#ifdef RLX_HAVE_MPI
namespace {

class MpiEngine final : public Engine {
 public:
  MpiEngine() {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) throw Error("distributed: MPI was already finalised in this process");
    if (!initialized) {
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        throw Error("distributed: MPI_Init_thread failed");
      owns_init_ = true;
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);  // errors come back as codes, and become rlx::Error
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiEngine() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Comm_free(&comm_);
    if (owns_init_) MPI_Finalize();
  }
  MpiEngine(const MpiEngine&) = delete;
  MpiEngine& operator=(const MpiEngine&) = delete;

  std::string_view name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }

  void all_gather(ConstBuffer in, Buffer out) override {
    const int n = count("all_gather", in.bytes());
    check(MPI_Allgather(in.data, n, MPI_BYTE, out.data, n, MPI_BYTE, comm_), "all_gather");
  }
  void reduce_scatter(ConstBuffer in, Buffer out, ReduceOp op) override {
    // Every rank sends chunk r to rank r, then reduces what it received in rank order.
    std::vector<std::byte> mine(out.bytes() * static_cast<std::size_t>(size_));
    const int n = count("reduce_scatter", out.bytes());
    check(MPI_Alltoall(in.data, n, MPI_BYTE, mine.data(), n, MPI_BYTE, comm_), "reduce_scatter");
    reduce_in_order({mine.data(), out.count * static_cast<std::size_t>(size_), out.dtype}, size_, out, op);
  }
  void broadcast(Buffer data, int root) override {
    check(MPI_Bcast(data.data, count("broadcast", data.bytes()), MPI_BYTE, root, comm_), "broadcast");
  }
  void send(ConstBuffer data, int dst) override {
    check(MPI_Send(data.data, count("send", data.bytes()), MPI_BYTE, dst, kTag, comm_), "send");
  }
  void recv(Buffer data, int src) override {
    MPI_Status status;
    check(MPI_Recv(data.data, count("recv", data.bytes()), MPI_BYTE, src, kTag, comm_, &status), "recv");
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    if (static_cast<std::size_t>(got) != data.bytes())
      throw Error("distributed.recv: rank " + std::to_string(rank_) + " expected " + std::to_string(data.bytes()) +
                  " bytes from rank " + std::to_string(src) + " but received " + std::to_string(got));
  }
  void barrier() override { check(MPI_Barrier(comm_), "barrier"); }

 private:
  static constexpr int kTag = 1801;

  int count(std::string_view op, std::size_t bytes) const {
    if (bytes > static_cast<std::size_t>(INT_MAX))
      throw Error("distributed." + std::string(op) + ": " + std::to_string(bytes) +
                  " bytes exceed what one MPI call moves (2^31 - 1) on rank " + std::to_string(rank_));
    return static_cast<int>(bytes);
  }
  void check(int rc, std::string_view op) const {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw Error("distributed." + std::string(op) + ": MPI failed on rank " + std::to_string(rank_) + ": " +
                std::string(text, static_cast<std::size_t>(len)));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  bool owns_init_ = false;
};

}  // namespace

std::shared_ptr<Engine> make_mpi_engine() {
  static std::weak_ptr<Engine> shared;  // one per process: MPI initialises once
  if (auto e = shared.lock()) return e;
  auto e = std::make_shared<MpiEngine>();
  shared = e;
  return e;
}
std::string mpi_unavailable_reason() { return {}; }
#else
std::shared_ptr<Engine> make_mpi_engine() { throw Error("distributed: engine mpi: " + mpi_unavailable_reason()); }
std::string mpi_unavailable_reason() {
  return "RLX was built without MPI (CMake found no MPI; install libopenmpi-dev and rebuild)";
}
#endif

}  // namespace rlx::distributed::detail
