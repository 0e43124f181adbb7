// Where planning meets running: a trainer made from a config (plan::make_plan, or the
// auto-planner for parallel.policy auto, or a plan.json checked against the config), handed to
// the runtime as the RunPlan it runs. The runtime itself never plans.
#pragma once

#include <memory>

#include "core/config.h"
#include "core/result.h"
#include "launch/extensions.h"
#include "lower/plan_file.h"
#include "plan/plan.h"
#include "plan/plan_for.h"
#include "runtime/trainer.h"

namespace loom::comm {
class Comm;
}  // namespace loom::comm

namespace loom::launch {

// The plan of `config` for this run's ranks (plan::plan_for): parallel.dp x cp x tp x pp of
// them, or under parallel.policy auto the world's (`world`'s size, else WORLD_SIZE), whose
// search rank 0 (`world`'s rank, else RANK) prints to stderr.
Result<plan::PlanChoice> plan_run(const Config& config, const plan::Registries& registries,
                                  const comm::Comm* world = nullptr);

// What the runtime receives of `plan`, made of `config` with `registries`.
Result<runtime::RunPlan> run_plan(const Config& config, plan::Plan plan,
                                  const plan::Registries& registries);

// A trainer running `plan`, made of `config` (runtime::Trainer::create says what it does).
// `extensions`: user ops, kernels, policies and model (null: loom's built-ins).
Result<std::unique_ptr<runtime::Trainer>> create_trainer(
    const Config& config, plan::Plan plan, std::shared_ptr<comm::Comm> world = nullptr,
    std::shared_ptr<const Extensions> extensions = nullptr);

// The same for the plan of `config` (the auto-planner's for parallel.policy auto), or for
// `plan_file` (read from plan.json) after refusing it when it is stale for this config and code.
Result<std::unique_ptr<runtime::Trainer>> create_trainer(
    const Config& config, std::shared_ptr<comm::Comm> world = nullptr,
    const lower::PlanFile* plan_file = nullptr,
    std::shared_ptr<const Extensions> extensions = nullptr);

}  // namespace loom::launch
