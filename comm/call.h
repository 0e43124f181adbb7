// A call in flight, shared by the Comm front (comm.cc), the bookkeeping that numbers calls and
// names missing ranks (call.cc) and the Work handle (work.cc). Internal to comm/.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "comm/comm.h"

namespace loom::comm {

using Hooks = std::vector<std::function<void()>>;

// Seconds since `start`.
inline double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A peer's arrival that a call waits for: its arrival key must reach `count`.
struct Awaited {
  Rank rank;  // world rank
  std::string key;
  uint64_t count = 0;
  std::string role;  // " at the matching send", for p2p; empty for collectives
};

struct Comm::Call {
  std::string what;  // "all_reduce #17", "recv #3 from rank 2 (tag 0)"
  Clock::time_point start;
  Clock::time_point deadline;
  double timeout_s = 0;
  std::vector<Awaited> awaited;
  bool p2p = false;
};

struct WorkState : std::enable_shared_from_this<WorkState> {
  std::shared_ptr<Comm> comm;  // null when failed before starting
  Comm::Call call;
  std::shared_ptr<PendingOp> op;  // kept after a device-side wait: the device may still run it
  Hooks on_success;
  std::mutex mu;
  bool done = false;
  bool on_device = false;  // done by ordering the caller's stream after the operation
  Status status;

  Status run_hooks();
  // Device-side wait where the backend has one (the hooks then queue their tensor work behind
  // it on the same stream), else the host waits.
  Status run(bool host);
  // After a device-side wait: the host waits for the operation itself.
  Status finish_on_host();
};

}  // namespace loom::comm
