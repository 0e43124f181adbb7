// parallel.* read once, as values: the device mesh, the pipeline schedule and the memory
// features. make_plan reads these, not the config's strings; every error names its key.
#pragma once

#include <cstdint>

#include "core/config.h"
#include "core/ids.h"
#include "core/result.h"
#include "lower/recompute.h"
#include "planner/mesh.h"
#include "scheduler/schedule_spec.h"

namespace loom::plan {

struct PlanSpec {
  planner::DeviceMesh mesh;  // dp x pp x cp x tp ranks, in planner/mesh.h's order
  int64_t ep = 1;            // expert-parallel ranks, carved out of the dp ranks
  bool sp = false;           // sequence parallelism over the tp ranks
  sched::ScheduleSpec schedule = sched::ScheduleSpec::predefined(sched::ScheduleKind::k1F1B);
  int64_t chunks = 1;  // pipeline stages per pipeline device
  lower::Recompute recompute = lower::Recompute::kNone;
  int64_t zero = 0;  // 0, 1 (optimizer state sharded) or 3 (parameters too)

  // parallel.* of `config`, checked.
  static Result<PlanSpec> of(const Config& config);

  bool pipelined() const { return mesh.pp() > 1 || chunks > 1; }
  // The pipeline device (pp coordinate) of `rank`.
  int64_t pipeline_device(Rank rank) const { return mesh.coord(rank).pp; }
};

}  // namespace loom::plan
