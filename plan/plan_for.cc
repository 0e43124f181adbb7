#include "plan/plan_for.h"

#include <string>

namespace loom::plan {

Result<Config> for_world(const Config& config, int64_t world_size, std::string* note) {
  note->clear();
  LOOM_ASSIGN_OR_RETURN(PlanSpec spec, PlanSpec::of(config));
  const planner::DeviceMesh was = spec.space.mesh;
  if (spec.space.policy == "auto" || world_size == was.size()) return config;
  const int64_t rest = was.size() / was.dp();  // tp x pp x cp, kept
  const std::string started = "started on " + std::to_string(world_size) + " ranks";
  if (world_size < 1 || world_size % rest != 0)
    return config.error("parallel.dp", started + ", but the config plans for " + was.to_string() +
                                           ", and the tp x pp x cp it keeps (" +
                                           std::to_string(rest) + ") does not divide " +
                                           std::to_string(world_size));
  const BatchSpec batch = spec.batch;
  LOOM_ASSIGN_OR_RETURN(spec.space.mesh,
                        planner::DeviceMesh::make(world_size / rest, was.pp(), was.tp(), was.cp()));
  spec.batch.dp = spec.space.mesh.dp();
  const std::string dp =
      "parallel.dp " + std::to_string(was.dp()) + " -> " + std::to_string(spec.batch.dp);
  if (batch.global % (batch.micro * spec.batch.dp) != 0)
    return config.error("batch.global", started + " (" + dp + "), but batch.global (" +
                                            std::to_string(batch.global) +
                                            ") is not divisible by batch.micro (" +
                                            std::to_string(batch.micro) + ") x parallel.dp (" +
                                            std::to_string(spec.batch.dp) + ")");
  *note = "loom: " + started + ", the config plans for " + was.to_string() + ": " + dp +
          ", tp, pp and cp kept; batch.global " + std::to_string(batch.global) +
          " kept: " + std::to_string(batch.micro_batches()) + " -> " +
          std::to_string(spec.batch.micro_batches()) + " micro-batches per rank per step\n";
  return with_spec(config, spec);
}

Result<PlanChoice> plan_for(const Config& config, const Registries& registries,
                            const CostModel& cost, int64_t world_size, const AutoOptions& options) {
  if (world_size == 0) world_size = config.parallel.world_size();
  if (config.parallel.policy != "auto") {
    LOOM_ASSIGN_OR_RETURN(Plan plan, make_plan(config, registries, cost, world_size));
    return PlanChoice{config, std::move(plan), ""};
  }
  LOOM_ASSIGN_OR_RETURN(AutoPlan chosen, auto_plan(config, registries, cost, world_size, options));
  std::string search = describe(chosen);
  return PlanChoice{std::move(chosen.config), std::move(chosen.plan), std::move(search)};
}

}  // namespace loom::plan
