#include "launch/planned_trainer.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#include "comm/comm.h"
#include "comm/make_comm.h"
#include "lower/equivalence.h"
#include "models/model.h"
#include "plan/plan_for.h"
#include "plan/plan_hash.h"

namespace loom::launch {
namespace {

observe::EstimateFigures estimate_figures(const plan::Estimate& estimate, const CostModel& cost) {
  observe::EstimateFigures f;
  f.cost_model = cost.name;
  f.bubble_ratio = estimate.bubble_ratio;
  f.step_s = estimate.step_s;
  for (const plan::RankEstimate& r : estimate.ranks) f.comm_s.push_back(r.comm_s);
  return f;
}

// A plan.json for this run: refused when stale for this config and code, of another world
// size or micro-batch count, not deadlock-free, or not proven equal to one device.
Result<plan::Plan> read_plan(const Config& config, const lower::PlanFile& file,
                             const plan::Registries& registries) {
  const int64_t world_size = config.parallel.world_size();
  plan::Plan plan;
  LOOM_ASSIGN_OR_RETURN(plan.model, plan::build_model(config, registries, world_size));
  LOOM_TRY(plan::check_plan_current(
      file, config, lower::model_digest(plan.model),
      lower::code_fingerprint(registries.ops.types(), registries.policies.names())));
  if (file.world_size != world_size)
    return Error::at(file.source, file.source + ": the plan is for " +
                                      std::to_string(file.world_size) + " ranks, this run has " +
                                      std::to_string(world_size));
  if (file.micro_batches != config.micro_batches())
    return Error::at(file.source, file.source + ": the plan runs " +
                                      std::to_string(file.micro_batches) +
                                      " micro-batches per step, this config " +
                                      std::to_string(config.micro_batches()));
  LOOM_TRY(lower::check_deadlock_free(file.graph, file.lowered));
  // A plan file is run only once proven equal to the model this config builds: its seal is a
  // checksum anyone can recompute, and an edited plan would otherwise crash or train wrongly.
  if (Status proven =
          lower::prove_equivalent(plan.model, file.graph, file.lowered, file.micro_batches);
      !proven.ok())
    return Error::at(file.source, file.source +
                                      ": the plan is not equal to one device, so it is "
                                      "not run (" +
                                      proven.error().message + "); make it again with `loom plan`");
  plan.file = file;
  return plan;
}

// The ranks a launcher started (WORLD_SIZE), where it says a valid number; else none (a
// malformed one is make_comm's to report).
std::optional<int64_t> launched_ranks(const comm::EnvLookup& env) {
  const std::optional<std::string> v = env("WORLD_SIZE");
  if (!v || v->empty() || v->size() > 9 || v->find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  const int64_t n = std::atoll(v->c_str());
  return n >= 1 ? std::optional<int64_t>(n) : std::nullopt;
}

}  // namespace

// The plan for the ranks the run was started on (plan::for_world: an elastic restart on fewer
// or more machines goes on with fewer or more data-parallel replicas). Under parallel.policy
// auto every rank searches the same plan (a pure function of the config and the cost model).
Result<plan::PlanChoice> plan_run(const Config& config, const plan::Registries& registries,
                                  const comm::Comm* world) {
  const comm::EnvLookup env = comm::process_env();
  int64_t ranks = config.parallel.world_size(), rank = 0;
  if (world) {
    rank = world->world_rank().value();
    ranks = world->size();
  } else {
    if (std::optional<std::string> v = env("RANK")) rank = std::atoll(v->c_str());
    if (std::optional<int64_t> n = launched_ranks(env)) ranks = *n;
  }
  std::string note;
  LOOM_ASSIGN_OR_RETURN(const Config fitted, plan::for_world(config, ranks, &note));
  if (rank == 0) std::fputs(note.c_str(), stdout);
  LOOM_ASSIGN_OR_RETURN(CostModel cost, resolve_cost_model(fitted));
  LOOM_ASSIGN_OR_RETURN(plan::PlanChoice chosen, plan::plan_for(fitted, registries, cost, ranks));
  if (rank == 0) std::fputs(chosen.search.c_str(), stderr);
  return chosen;
}

Result<runtime::RunPlan> run_plan(const Config& config, plan::Plan plan,
                                  const plan::Registries& registries) {
  runtime::RunPlan run;
  if (!plan.estimate.ranks.empty()) {  // a plan.json brings no estimate
    run.estimate = estimate_figures(plan.estimate, plan.cost);
    run.peak_bytes = plan.estimate.max_peak_bytes();
  }
  if (!registries.model) {  // a model set to replace every type counts samples
    LOOM_ASSIGN_OR_RETURN(const models::ModelType* type, registries.models.of(config));
    if (type->items) {
      LOOM_ASSIGN_OR_RETURN(models::SampleItems items, type->items(config));
      run.items_per_sample = items.per_sample;
    }
    run.hf_names = type->hf_names;
  }
  LOOM_ASSIGN_OR_RETURN(plan::PlanSpec spec, plan::PlanSpec::of(config));
  run.zero = spec.zero;
  run.bucket_bytes = spec.bucket_bytes;
  run.global_batch = spec.batch.global;
  run.device = spec.device;
  run.precision = spec.precision;
  run.backend = spec.backend;
  run.optimizer = spec.optimizer;
  run.degrees = config.parallel.degrees();
  const planner::DeviceMesh& mesh = spec.mesh();
  run.plan_name = "dp" + std::to_string(mesh.dp()) +
                  (mesh.cp() > 1 ? " x cp" + std::to_string(mesh.cp()) : std::string()) + " x tp" +
                  std::to_string(mesh.tp()) + " x pp" + std::to_string(mesh.pp());
  run.model = std::move(plan.model);
  run.file = std::move(plan.file);
  return run;
}

Result<std::unique_ptr<runtime::Trainer>> create_trainer(
    const Config& config, plan::Plan plan, std::shared_ptr<comm::Comm> world,
    std::shared_ptr<const Extensions> extensions) {
  if (!extensions) extensions = std::make_shared<const Extensions>();
  LOOM_ASSIGN_OR_RETURN(runtime::RunPlan run, run_plan(config, std::move(plan), *extensions));
  return runtime::Trainer::create(config, std::move(run), std::move(world), &extensions->kernels);
}

Result<std::unique_ptr<runtime::Trainer>> create_trainer(
    const Config& config, std::shared_ptr<comm::Comm> world, const lower::PlanFile* plan_file,
    std::shared_ptr<const Extensions> extensions) {
  if (!extensions) extensions = std::make_shared<const Extensions>();
  const plan::Registries& registries = *extensions;
  if (plan_file) {
    LOOM_ASSIGN_OR_RETURN(plan::Plan plan, read_plan(config, *plan_file, registries));
    return create_trainer(config, std::move(plan), std::move(world), std::move(extensions));
  }
  LOOM_ASSIGN_OR_RETURN(plan::PlanChoice chosen, plan_run(config, registries, world.get()));
  return create_trainer(chosen.config, std::move(chosen.plan), std::move(world),
                        std::move(extensions));
}

}  // namespace loom::launch
