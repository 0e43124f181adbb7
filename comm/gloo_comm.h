// The gloo backend: LibTorch c10d's ProcessGroupGloo over loom's rendezvous store (store.h). The
// default backend on CPU.
#pragma once

#include <memory>
#include <string>

#include "comm/comm.h"
#include "core/result.h"

namespace loom::comm {

class RendezvousStore;

// The world group of `size` processes; `master_addr` picks the network device (loopback when
// the store is on this machine's loopback address). With `shared_memory`, a group whose members
// all run on one host reduces, gathers and broadcasts through shared memory
// (shm_collectives.h); point-to-point and barriers stay on gloo.
Result<std::shared_ptr<Comm>> make_gloo_comm(std::shared_ptr<RendezvousStore> store, int rank,
                                             int size, const std::string& master_addr,
                                             double timeout_s, bool shared_memory = true);

}  // namespace loom::comm
