// The planning chain's first steps as tests call them: the single-device graph make_plan
// builds, and the model type's checks of a config's split, both with errors located in the
// config (what a user reads).
#pragma once

#include "core/config.h"
#include "core/result.h"
#include "graph/graph.h"
#include "graph/op_registry.h"
#include "models/model.h"
#include "plan/model_check.h"
#include "plan/plan.h"
#include "plan/plan_hash.h"
#include "plan/plan_spec.h"

namespace loom::testing_support {

// The built-in registries with the op types of `ops`.
inline plan::Registries registries_with(const graph::OpRegistry& ops) {
  plan::Registries registries;
  registries.ops = ops;
  return registries;
}

// plan::build_model of `config` for one rank: verified, in run.precision, with context
// parallelism's ring attention in place.
inline Result<graph::Graph> single_device_graph(
    const Config& config, const graph::OpRegistry& ops = graph::OpRegistry::with_builtin_ops()) {
  return plan::build_model(config, registries_with(ops), 1);
}

// The model type's checks of the config's split in space (plan::check_model).
inline Status check_split(const Config& config) {
  return plan::check_model(config, models::ModelRegistry::with_builtin_models());
}

// The space spec of `config` (plan::PlanSpec::of(config)->space).
inline Result<planner::SpaceSpec> space_of(const Config& config) {
  LOOM_ASSIGN_OR_RETURN(const plan::PlanSpec spec, plan::PlanSpec::of(config));
  return spec.space;
}

// lower::pipeline_order of the config's pipeline with `micro_batches` micro-batches, errors
// located in the config.
inline Result<lower::PipelineOrder> pipeline_order_of(const Config& config, int64_t micro_batches,
                                                      const lower::StageCosts& costs = {}) {
  LOOM_ASSIGN_OR_RETURN(const plan::PlanSpec spec, plan::PlanSpec::of(config));
  lower::PipelineRequest request = spec.pipeline();
  request.micro_batches = micro_batches;
  auto order = lower::pipeline_order(request, costs);
  if (!order.ok()) return config.locate(order.error());
  return order;
}

// The plan hash of `config` on its cost model (plan::plan_hash).
inline std::string plan_hash_of(const Config& config, const std::string& model_digest,
                                const std::string& code_fingerprint) {
  auto spec = plan::PlanSpec::of(config);
  auto cost = resolve_cost_model(config);
  LOOM_CHECK(spec.ok() && cost.ok()) << "a test config that does not plan";
  return plan::plan_hash(*spec, *cost, model_digest, code_fingerprint);
}

}  // namespace loom::testing_support
