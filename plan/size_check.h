// Size checks that come before anything is built: a model whose weights cannot fit the world's
// devices, or a plan too large for this machine to hold while loom makes it, is refused in well
// under a second naming the key, instead of after minutes and gigabytes.
#pragma once

#include <cstdint>

#include "core/config.h"
#include "core/cost_model.h"
#include "core/result.h"
#include "graph/graph.h"
#include "models/model.h"
#include "plan/plan_spec.h"

namespace loom::plan {

// The model's weights, gradients and optimizer state (a lower bound of what training holds)
// against the memory of `world_size` devices of the cost model. Types without a size pass.
Status check_model_fits(const Config& config, const PlanSpec& spec, const models::ModelType& type,
                        const CostModel& cost, int64_t world_size);

// Every rank's sub-operators, which loom holds while it plans, against this machine's memory:
// about kPlannedOpBytes each (357 to 366 bytes measured, peak resident memory less the
// process's own, on GPT tiny data-parallel plans of 256 to 2,048 ranks).
constexpr double kPlannedOpBytes = 350;
Status check_plan_fits(const graph::Graph& model, const PlanSpec& spec, int64_t world_size);

}  // namespace loom::plan
