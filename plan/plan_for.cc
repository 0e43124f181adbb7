#include "plan/plan_for.h"

namespace loom::plan {

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
