#pragma once
// The engines behind rlx::distributed::Communicator, each in its own file.
// A factory throws rlx::Error saying why its engine is not usable here.
// (make_local_engine and make_tcp_engine are public: distributed.hpp.)
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "rlx/distributed/distributed.hpp"

namespace rlx::distributed::detail {

class TcpStore;

// MPI_COMM_WORLD, initialising MPI (MPI_THREAD_SERIALIZED) unless the host already did; finalised when the last
// holder of the engine lets go (at exit for the world communicator init() keeps).
std::shared_ptr<Engine> make_mpi_engine();
std::string mpi_unavailable_reason();

// Called on every rank with rank 0's bytes filled in on rank 0; fills them in on the others.
using ShareFromRank0 = std::function<void(std::span<std::byte>)>;

// NCCL over `world_size` ranks on GPU `device`. With more than one rank, `share` carries rank 0's unique id to
// the others (over MPI under mpirun, through the TCP store otherwise); `keep_alive` is held as long as the engine
// (the MPI engine, which finalises MPI when released).
std::shared_ptr<Engine> make_nccl_engine(int rank, int world_size, int device, const ShareFromRank0& share,
                                         std::shared_ptr<void> keep_alive);
std::string nccl_unavailable_reason();

// NCCL_UNIQUE_ID_BYTES (nccl.cpp checks it against nccl.h where that is built in).
constexpr std::size_t kNcclUniqueIdBytes = 128;
// How ranks started with RANK/WORLD_SIZE share NCCL's unique id: rank 0 sets it in the store, the others wait
// for it. What init() passes to make_nccl_engine; tested with the store alone (no GPU needed).
ShareFromRank0 nccl_id_through_store(std::shared_ptr<TcpStore> store);

}  // namespace rlx::distributed::detail
