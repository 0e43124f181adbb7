#include "plan/plan_spec.h"

namespace loom::plan {
namespace {

Status check_two_pipelines(const Config& config, const planner::SpaceSpec& space) {
  const planner::DeviceMesh& mesh = space.mesh;
  if (mesh.cp() > 1)
    return config.error("parallel.cp",
                        "context parallelism does not combine with chimera's two "
                        "pipelines; choose another parallel.schedule");
  if (mesh.pp() < 2 || mesh.pp() % 2 != 0)
    return config.error("parallel.pp",
                        "chimera needs an even number of pipeline stages, got parallel.pp=" +
                            std::to_string(mesh.pp()));
  if (space.chunks != 1)
    return config.error("parallel.chunks",
                        "chimera places one stage per pipeline rank in each direction, got "
                        "parallel.chunks=" +
                            std::to_string(space.chunks));
  return Status::success();
}

}  // namespace

Result<PlanSpec> PlanSpec::of(const Config& config) {
  const ParallelConfig& p = config.parallel;
  PlanSpec spec;
  LOOM_ASSIGN_OR_RETURN(spec.space, planner::SpaceSpec::of(config));
  auto schedule = sched::ScheduleSpec::parse(p.schedule, p.schedule_csv);
  if (!schedule.ok()) return config.error("parallel.schedule", schedule.error().message);
  spec.schedule = std::move(schedule).value();
  spec.space.two_pipelines = spec.schedule.is(sched::ScheduleKind::kChimera);
  if (spec.space.two_pipelines) LOOM_TRY(check_two_pipelines(config, spec.space));
  auto recompute = lower::parse_recompute(p.recompute);
  if (!recompute.ok()) return config.error("parallel.recompute", recompute.error().message);
  spec.recompute = *recompute;
  spec.zero = p.zero;
  return spec;
}

}  // namespace loom::plan
