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

// `config` for the `world_size` ranks a run was started on, where it plans for another number
// (an elastic restart on fewer or more machines): tp, pp, cp, ep, the schedule, the memory
// features and the global batch kept, parallel.dp the world over the rest, so that the run goes
// on as the same training with more or fewer micro-batches per rank. `note` says what changed
// (empty when nothing did). Under parallel.policy auto the config is returned as it is: the
// auto-planner plans for the world. Refused, naming the numbers, where the world does not divide.
Result<Config> for_world(const Config& config, int64_t world_size, std::string* note);

// The plan of `config` for `world_size` ranks (0: parallel.dp x cp x tp x pp) on `cost`.
Result<PlanChoice> plan_for(const Config& config, const Registries& registries,
                            const CostModel& cost, int64_t world_size = 0,
                            const AutoOptions& options = {});

}  // namespace loom::plan
