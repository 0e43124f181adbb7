// Dynamic axial parallelism (DAP, FastFold): for models over 2-D representations (the
// Evoformer's MSA and pair), each op is split along the axis its `dap` attribute names (1 or
// 2: a dimension of its first output, or of its first input when the output is a scalar), so
// row-wise ops hold whole rows and column-wise ops whole columns. The all-to-all between the
// two layouts, and the all-gathers of attention biases, are left to the lowering's path search.
#pragma once

#include "planner/policy.h"

namespace loom::planner {

// The hybrid engine (stages by layer, dp over the batch, mesh dp x pp x tp) with parallel.tp
// as the DAP degree: inside a stage each op splits along its hinted axis. Fails naming the op
// that carries no hint.
Result<graph::Graph> dap_policy(const graph::Graph& graph, const PlanRequest& request);

}  // namespace loom::planner
