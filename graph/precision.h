// A run's precision as a property of the graph: under bf16 every floating activation and model
// input is bf16, so the plan's byte counts, memory estimates and the runtime's buffers all read
// the one dtype per tensor. Parameters stay float32 (master weights: the runtime computes with a
// bf16 copy), and so do losses and the outputs of ops whose schema keeps them float32.
#pragma once

#include "core/shape.h"
#include "graph/graph.h"
#include "graph/op_registry.h"

namespace loom::graph {

// The graph with activations and floating inputs in `compute`; unchanged for kFloat32.
Graph with_compute_dtype(Graph graph, DType compute, const OpRegistry& ops);

}  // namespace loom::graph
