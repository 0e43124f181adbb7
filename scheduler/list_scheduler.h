// Greedy list scheduling: repeatedly start the block that can start earliest (ties broken by
// priority) within a per-device memory limit. Builds the schedules that are defined by a rule
// rather than a fixed order (ZB-H1, Chimera), the baselines for arbitrary placements, and the
// search's warm-up and cool-down.
#pragma once

#include <functional>
#include <vector>

#include "core/result.h"
#include "scheduler/workload.h"

namespace loom::sched {

struct ListPolicy {
  // Lower runs first among blocks that can start at the same time.
  std::function<double(int block)> priority;
  // Per device, in the blocks' memory units; empty means unlimited.
  std::vector<double> memory_limit;
  double comm_delay = 0;
};

// Per-device orders (workload indices). Fails when the memory limit leaves no block startable.
Result<std::vector<std::vector<int>>> list_schedule(const Workload& workload,
                                                    const ListPolicy& policy);

// The same blocks with every dependency reversed and every memory change negated: scheduling
// it forward schedules the original backward in time (right justification). A device's memory
// levels are the same in either direction.
Workload reversed(const Workload& workload);

// Double justification: right-justify `order` (latest end first, scheduled backward in time),
// then left-justify the result (earliest start first), keeping each device within the memory
// limit; repeated while the makespan shrinks. Returns the best order found (`order` if none
// is better).
std::vector<std::vector<int>> justify(const Workload& workload, std::vector<std::vector<int>> order,
                                      const ListPolicy& limits, int rounds = 4);

}  // namespace loom::sched
