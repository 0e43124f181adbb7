// The gloo backend: LibTorch c10d's ProcessGroupGloo over a TCPStore rendezvous. The default
// backend on CPU.
#pragma once

#include <memory>
#include <string>

#include "comm/comm.h"
#include "core/result.h"

namespace loom::comm {

class RendezvousStore;

// The world group of `size` processes; `master_addr` picks the network device (loopback when
// the store is on this machine's loopback address).
Result<std::shared_ptr<Comm>> make_gloo_comm(std::shared_ptr<RendezvousStore> store, int rank,
                                             int size, const std::string& master_addr,
                                             double timeout_s);

}  // namespace loom::comm
