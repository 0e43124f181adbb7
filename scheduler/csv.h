// The compute-only CSV schedule format of torch.distributed.pipelining: one row per rank, one
// action per cell ("0F0" stage 0 forward of micro-batch 0, "1B3", "2I1", "2W1"), an empty cell
// where the rank idles for a step. Schedules move between loom and torchtitan through it.
#pragma once

#include <string>

#include "core/result.h"
#include "scheduler/schedule.h"

namespace loom::sched {

// One column per step of the schedule run with every block taking one step, so idle steps
// show as empty cells. A block on several devices appears in each of their rows.
Result<std::string> to_csv(const Schedule& schedule);

// Block costs of an imported chain pipeline, in `loom schedule` units: fwd and bwd per
// device's share (a stage of v stages per device takes 1/v), wgrad for W when B is split.
struct CsvImportOptions {
  double fwd = 1;
  double bwd = 2;
  double wgrad = 1;
};

// Builds the chain pipeline the cells name (stages 0..S-1, micro-batches 0..m-1) with the
// device of each block from its row, then validates the order. Errors name row and column.
Result<Schedule> from_csv(const std::string& text, const CsvImportOptions& options = {});

}  // namespace loom::sched
