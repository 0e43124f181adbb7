// The one way from a config to the plan a run uses: make_plan's plan, or with parallel.policy
// auto the auto-planner's choice. `loom plan`, `loom train` and the embedding API all call it.
#pragma once

#include <cstdint>
#include <string>

#include "core/config.h"
#include "core/cost_model.h"
#include "core/result.h"
#include "plan/auto_plan.h"
#include "plan/plan.h"

namespace loom::plan {

struct PlanChoice {
  Config config;  // what the plan was made of: the given config, or the search's winner's
  Plan plan;
  // With parallel.policy auto: what the search chose, ranked (describe()); else empty.
  std::string search;
};

// The plan of `config` for `world_size` ranks (0: parallel.dp x cp x tp x pp) on `cost`.
Result<PlanChoice> plan_for(const Config& config, const Registries& registries,
                            const CostModel& cost, int64_t world_size = 0,
                            const AutoOptions& options = {});

}  // namespace loom::plan
