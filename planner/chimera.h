// Chimera's placement: two pipelines over the same devices in opposite directions. The "down"
// pipeline runs stage s on pipeline rank s, the "up" pipeline on rank p-1-s, so every device
// holds two stages and the two pipelines fill each other's bubbles. Each pipeline is a full
// replica of the model: its own activations and loss, the same parameters (their gradients are
// synchronised over the replicas like data-parallel ones). Even micro-batches go down, odd ones
// up; the up pipeline's stage s is numbered p + s (lower/schedule_order.cc maps Chimera's
// blocks onto these stages).
#pragma once

#include "core/result.h"
#include "graph/graph.h"
#include "planner/mesh.h"

namespace loom::planner {

// The name suffix of the up pipeline's tensors and ops.
inline constexpr const char* kUpPipelineSuffix = "@up";

// Adds the up pipeline to `down`, a graph placed on `mesh` with stages 0..mesh.pp()-1 (stage s
// on pipeline rank s). Fails naming the op when a stage is not on its own pipeline rank.
Result<graph::Graph> add_up_pipeline(const graph::Graph& down, const DeviceMesh& mesh);

}  // namespace loom::planner
