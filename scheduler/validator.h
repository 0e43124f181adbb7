// The validator: a per-device order is accepted only if every block runs exactly once on each
// of its devices, no block runs before a dependency on the same device, and the devices cannot
// deadlock once send/recv are inserted between them (sends are posted when the producer ends,
// a receive blocks its device until then).
#pragma once

#include <vector>

#include "core/result.h"
#include "scheduler/workload.h"

namespace loom::sched {

// Maps named blocks to workload indices; rejects unknown, misplaced and duplicated blocks.
Result<std::vector<std::vector<int>>> resolve_order(const Workload& workload,
                                                    const std::vector<std::vector<BlockId>>& order);

// Checks a resolved order (indices per device). Errors name the offending blocks.
Status validate_order(const Workload& workload, const std::vector<std::vector<int>>& order);

// A topological order of all blocks under dependencies + device order, or the deadlock error.
Result<std::vector<int>> execution_order(const Workload& workload,
                                         const std::vector<std::vector<int>>& order);

}  // namespace loom::sched
