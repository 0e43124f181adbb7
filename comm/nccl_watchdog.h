// The nccl backend's watchdog (internal to comm/): holds device-side waits to their deadlines.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

#include "comm/nccl_handle.h"

namespace loom::comm {

// Holds device-side waits to their deadlines: polls each operation's completion event
// (cudaEventQuery) and its communicator's asynchronous error, reports a failure or a passed
// deadline once through the call's callback and aborts every communicator. Also keeps the
// tensors of operations still running on the device alive until they finish.
//
// The polling thread owns its state and outlives the Watchdog object (it is detached): a
// callback may drop the last reference to a Comm, and so to the world that owns this object,
// from that very thread. It ends once stopped and every operation it holds is over.
class Watchdog {
 public:
  struct Entry {
    std::shared_ptr<NcclHandle> h;
    std::shared_ptr<CudaEvent> done;
    std::vector<at::Tensor> keep;
    Clock::time_point deadline;
    std::function<void(Outcome)> on_failure;  // empty for an abandoned operation
    bool reported = false;
  };

  Watchdog(int device, std::shared_ptr<NcclRegistry> registry);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void watch(Entry entry);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace loom::comm
