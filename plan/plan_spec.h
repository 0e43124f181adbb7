// parallel.* read once, as values: the split in space (the device mesh and what the policies
// read), the pipeline schedule and the memory features. make_plan reads these, not the config's
// strings; every error names its key.
#pragma once

#include <cstdint>

#include "core/config.h"
#include "core/ids.h"
#include "core/result.h"
#include "lower/recompute.h"
#include "planner/space_spec.h"
#include "scheduler/schedule_spec.h"

namespace loom::plan {

struct PlanSpec {
  // The mesh, stages and splits the policy applies; two_pipelines where the schedule is
  // chimera's.
  planner::SpaceSpec space;
  sched::ScheduleSpec schedule = sched::ScheduleSpec::predefined(sched::ScheduleKind::k1F1B);
  lower::Recompute recompute = lower::Recompute::kNone;
  int64_t zero = 0;  // 0, 1 (optimizer state sharded) or 3 (parameters too)

  // parallel.* of `config`, checked: chimera's two pipelines need an even pipeline degree,
  // one stage per device in each direction and no context parallelism.
  static Result<PlanSpec> of(const Config& config);

  const planner::DeviceMesh& mesh() const { return space.mesh; }
  bool pipelined() const { return space.mesh.pp() > 1 || space.chunks > 1; }
  // The pipeline device (pp coordinate) of `rank`.
  int64_t pipeline_device(Rank rank) const { return space.mesh.coord(rank).pp; }
};

}  // namespace loom::plan
