// Pipeline stages by model layer: balanced by the cost model, or given in parallel.stages.
#pragma once

#include <cstdint>
#include <vector>

#include "core/result.h"
#include "graph/graph.h"
#include "planner/space_spec.h"

namespace loom::planner {

struct StagePlan {
  // first_layer[k]..last_layer[k] (inclusive) are stage k's layers. Ops before the first layer
  // join stage 0, ops after the last layer join the last stage.
  std::vector<int64_t> first_layer;
  std::vector<int64_t> last_layer;
  std::vector<double> flops;  // forward FLOPs per stage

  int64_t stages() const { return static_cast<int64_t>(first_layer.size()); }
  int64_t stage_of_layer(int64_t layer) const;
};

// space.pipeline_stages() stages over the graph's layers (pp x chunks): space.stages when
// given, else balanced. Errors name the key `space` was read from (Error::at).
Result<StagePlan> plan_stages(const graph::Graph& graph, const SpaceSpec& space);

}  // namespace loom::planner
