// The local backend: every rank is a thread of this process. Used by unit tests and by property
// tests of the lowering, so it implements every operation with the same semantics, checks and
// timeouts as the process backends.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "comm/comm.h"
#include "core/ids.h"
#include "core/result.h"

namespace loom::comm {

struct LocalShared;

// N Comms that share state; hand comm(r) to the thread playing rank r.
class LocalWorld {
 public:
  explicit LocalWorld(int size, double timeout_s = 300);

  int size() const { return static_cast<int>(comms_.size()); }
  // The world Comm of `rank` (the same object on every call).
  std::shared_ptr<Comm> comm(Rank rank) const;
  // Runs fn on one thread per rank with that rank's Comm; returns each rank's status (an exception
  // becomes an error naming the rank).
  std::vector<Status> run(const std::function<Status(Comm&)>& fn) const;

 private:
  std::shared_ptr<LocalShared> shared_;
  std::vector<std::shared_ptr<Comm>> comms_;
};

}  // namespace loom::comm
