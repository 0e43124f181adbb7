// The nccl backend (CUDA builds): NCCL on CUDA tensors, one CUDA stream per communicator, the
// unique id shared through the rendezvous store. Compiled only when the CUDA toolkit and NCCL are
// found (LOOM_CUDA); a call with CPU tensors fails with "nccl backend needs CUDA tensors".
//
// NCCL has no message tags: messages between a pair of ranks match in call order, whatever the
// tag.
#pragma once

#include <memory>

#include "core/result.h"
#include "exec/comm/comm.h"

namespace loom::comm {

class RendezvousStore;

// An error saying why this process cannot run NCCL (no CUDA driver or device), else success.
Status nccl_usable();

// The world group; `local_rank` picks the CUDA device (-1: rank modulo the device count).
Result<std::shared_ptr<Comm>> make_nccl_comm(std::shared_ptr<RendezvousStore> store, int rank,
                                             int size, int local_rank, double timeout_s);

}  // namespace loom::comm
