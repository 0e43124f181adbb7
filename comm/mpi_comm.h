// The mpi backend: Open MPI (or any MPI-3 library) with non-blocking calls polled against each
// call's deadline. Chosen by `auto` when the process was started by mpirun or srun.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "comm/comm.h"
#include "core/result.h"

namespace loom::comm {

// The world group of MPI_COMM_WORLD (initialising MPI when nobody did). The arrival board lives
// in the rendezvous store (store.h) hosted by rank 0 at master_addr:master_port when given, else on
// rank 0's host at a free port; without it, failures still name the call but cannot name missing
// ranks.
Result<std::shared_ptr<Comm>> make_mpi_comm(std::optional<std::string> master_addr,
                                            std::optional<int> master_port, double timeout_s);

}  // namespace loom::comm
