// The model zoo: builds the graph named by model.type from a config.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "core/result.h"
#include "graph/graph.h"
#include "graph/op_registry.h"
#include "planner/policy.h"

namespace loom::models {

std::vector<std::string> model_types();
// The graph of one micro-batch across all data-parallel replicas (batch.micro x parallel.dp).
Result<graph::Graph> build_model(const Config& config, const graph::OpRegistry& registry);
// Checks that the configured parallel degrees fit the model (e.g. tensor parallelism divides
// the heads, the MLP width and the vocabulary groups), naming the keys and numbers.
Status check_parallel(const Config& config);
// Builds the model, checks the parallel config against it and runs the configured policy for
// `world_size` ranks.
Result<graph::Graph> build_plan(const Config& config, const graph::OpRegistry& registry,
                                const planner::PolicyRegistry& policies, int64_t world_size);

// What a throughput figure counts for the configured model: tokens for a language model
// (per_sample = sequence length), images for a vision model (per_sample = 1).
struct SampleItems {
  int64_t per_sample = 1;
  std::string unit = "samples";
};
Result<SampleItems> items_per_sample(const Config& config);

}  // namespace loom::models
