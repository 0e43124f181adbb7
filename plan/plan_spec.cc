#include "plan/plan_spec.h"

namespace loom::plan {

Result<PlanSpec> PlanSpec::of(const Config& config) {
  const ParallelConfig& p = config.parallel;
  PlanSpec spec;
  auto mesh = planner::DeviceMesh::make(p.dp, p.pp, p.tp, p.cp);
  if (!mesh.ok()) return config.error("parallel.dp", mesh.error().message);
  spec.mesh = *mesh;
  spec.ep = p.ep;
  spec.sp = p.sp;
  auto schedule = sched::ScheduleSpec::parse(p.schedule, p.schedule_csv);
  if (!schedule.ok()) return config.error("parallel.schedule", schedule.error().message);
  spec.schedule = std::move(schedule).value();
  spec.chunks = p.chunks;
  auto recompute = lower::parse_recompute(p.recompute);
  if (!recompute.ok()) return config.error("parallel.recompute", recompute.error().message);
  spec.recompute = *recompute;
  spec.zero = p.zero;
  return spec;
}

}  // namespace loom::plan
