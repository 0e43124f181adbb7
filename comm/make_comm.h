// Creating the world Comm of a worker from the run config and the launcher's environment, and
// sizing LibTorch's thread pool for a worker.
//
// Environment read (set by loomrun, torchrun, mpirun or srun):
//   RANK, WORLD_SIZE           this worker's rank and the number of workers (gloo, nccl)
//   MASTER_ADDR, MASTER_PORT   where rank 0 hosts the rendezvous store (gloo, nccl; optional
//                              for mpi, which otherwise picks rank 0's host and a free port)
//   LOOM_RDZV_TOKEN            the job's secret, the same for every rank: rank 0's store admits
//                              only ranks that present it (gloo, nccl; needed when WORLD_SIZE
//                              > 1; loomrun sets it)
//   LOCAL_RANK                 the CUDA device of this worker (nccl)
//   LOCAL_WORLD_SIZE           workers on this machine (configure_worker_threads)
//   OMP_NUM_THREADS            intra-op threads of this worker, when set (configure_worker_threads)
//   OMPI_COMM_WORLD_RANK/SIZE  set by Open MPI's mpirun; `auto` then picks mpi
//   PMI_RANK/PMI_SIZE          set by srun/MPICH; `auto` then picks mpi
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "core/config.h"
#include "core/result.h"

namespace loom::comm {

// Looks up an environment variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_env();

// The world Comm for config.backend:
//   auto  for a run on GPUs (`gpu`), nccl when WORLD_SIZE is set or under mpirun/srun; else mpi
//         when started by mpirun/srun, else gloo when WORLD_SIZE is set (nccl in a build
//         without gloo); else a world of one
//   gloo | mpi | nccl | local (local: a world of one; use LocalWorld for threads as ranks)
// Every call of the Comm is bounded by config.timeout_s. Errors name comm.backend or the
// environment variable at fault.
Result<std::shared_ptr<Comm>> make_comm(const CommConfig& config,
                                        const EnvLookup& env = process_env(), bool gpu = false);

// Whether a launcher started this process as one worker of several: WORLD_SIZE (loomrun,
// torchrun), OMPI_COMM_WORLD_SIZE (mpirun) or PMI_SIZE (srun, MPICH) above 1.
bool started_by_launcher(const EnvLookup& env = process_env());

// This worker's LOCAL_RANK (its GPU on the machine); 0 when unset.
int64_t local_rank(const EnvLookup& env = process_env());

// The backends compiled into this build ("local"; "gloo", "mpi", "nccl" when found).
std::vector<std::string> built_backends();

// Sets LibTorch's intra-op threads to OMP_NUM_THREADS when that is a positive integer (as PyTorch
// does: the user or the launcher chose), else to max(1, cores / LOCAL_WORLD_SIZE) so that workers
// sharing a machine do not oversubscribe it; returns the number set.
int configure_worker_threads(const EnvLookup& env = process_env());

}  // namespace loom::comm
