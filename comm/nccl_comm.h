// The nccl backend (CUDA builds): NCCL on CUDA tensors. Compiled only when the CUDA toolkit and
// NCCL are found (LOOM_CUDA); a call with CPU tensors fails with "the nccl backend needs CUDA
// tensors".
//
// Ordering: each communicator has its own CUDA stream. A call makes that stream wait on an event
// recorded on the caller's current stream, enqueues the NCCL work, and records a completion
// event; Work::wait() makes the caller's current stream wait on it (no host blocking), and a
// watchdog thread checks the event against the call's deadline (cudaEventQuery, NCCL's
// asynchronous errors). A failure or timeout aborts every communicator of the world and makes
// the group unusable, naming the call, the group and the missing ranks.
//
// The sends and receives of a batch_isend_irecv are one NCCL group. Communicators are created
// non-blocking (NCCL >= 2.14) and polled against the deadline; sub-groups come from
// ncclCommSplit (NCCL >= 2.18), else from a unique id shared through the rendezvous store.
//
// NCCL has no message tags: messages between a pair of ranks match in call order, whatever the
// tag.
#pragma once

#include <memory>
#include <string>

#include "comm/comm.h"
#include "core/result.h"

namespace loom::comm {

class RendezvousStore;

// An error saying why this process cannot run NCCL (no CUDA driver or device), else success.
Status nccl_usable();

// "2.28.9 (runtime), 2.28.9 (headers)": the NCCL this process loaded and the one it was built
// against.
std::string nccl_versions();

// The world group; `local_rank` picks the CUDA device (-1: rank modulo the device count).
Result<std::shared_ptr<Comm>> make_nccl_comm(std::shared_ptr<RendezvousStore> store, int rank,
                                             int size, int local_rank, double timeout_s);

}  // namespace loom::comm
