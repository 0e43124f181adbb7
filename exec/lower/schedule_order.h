// The order of pipeline blocks each rank runs, from parallel.schedule and the scheduler.
#pragma once

#include <vector>

#include "core/config.h"
#include "core/result.h"
#include "exec/lower/program.h"

namespace loom::lower {

// Each rank's (kind, stage, micro-batch) blocks for parallel.schedule with `micro_batches`
// micro-batches; rank r runs the blocks of pipeline device (r's pp coordinate). Empty without
// pipeline parallelism. Chimera's up pipeline runs stages p..2p-1 (planner/chimera.h);
// zb-h1 is refused (loom schedule simulates it).
Result<std::vector<std::vector<ProgramBlock>>> pipeline_order(const Config& config,
                                                              int64_t micro_batches);

}  // namespace loom::lower
