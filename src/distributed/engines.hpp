#pragma once
// The engines behind rlx::distributed::Communicator, each in its own file.
// A factory throws rlx::Error saying why its engine is not usable here.
#include <memory>
#include <string>

#include "rlx/distributed/distributed.hpp"

namespace rlx::distributed::detail {

// MPI_COMM_WORLD, initialising MPI (MPI_THREAD_SERIALIZED) unless the host already did; finalised when the last
// holder of the engine lets go (at exit for the world communicator init() keeps).
std::shared_ptr<Engine> make_mpi_engine();
std::string mpi_unavailable_reason();

// NCCL over `world_size` ranks on GPU `device`. With more than one rank, `bootstrap` (an engine that already
// connects the same ranks, e.g. MPI) carries rank 0's unique id to the others.
std::shared_ptr<Engine> make_nccl_engine(int rank, int world_size, int device, std::shared_ptr<Engine> bootstrap);
std::string nccl_unavailable_reason();

}  // namespace rlx::distributed::detail
