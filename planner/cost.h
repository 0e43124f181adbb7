// The planner's cost model per op: floating-point operations of the forward pass and bytes of
// the activations it keeps for backward. Plain estimates, enough to balance pipeline stages
// and to compare plans; known op types have exact counts, custom ops a rule from their labels.
#pragma once

#include "graph/graph.h"

namespace loom::planner {

// Forward FLOPs of `op` on its pieces (backward is counted as twice this by callers).
double op_flops(const graph::Op& op);
// Bytes of `op`'s outputs (the activations it adds while a micro-batch is in flight).
double op_output_bytes(const graph::Graph& graph, const graph::Op& op);

}  // namespace loom::planner
