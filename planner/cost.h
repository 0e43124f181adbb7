// The planner's cost model per op: floating-point operations of the forward pass and bytes of
// the activations it keeps for backward. Plain estimates, enough to balance pipeline stages
// and to compare plans; an op type's registry entry gives its count (OpRules::flops), an op
// without one a rule from the size of its operands.
#pragma once

#include "graph/graph.h"

namespace loom::planner {

// Forward FLOPs of `op` on its pieces (the backward's are scheduler::block_time's multiple).
double op_flops(const graph::Op& op);
// Bytes of `op`'s outputs (the activations it adds while a micro-batch is in flight).
double op_output_bytes(const graph::Graph& graph, const graph::Op& op);

}  // namespace loom::planner
