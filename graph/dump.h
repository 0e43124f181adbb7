// A stable, line-oriented text form of a graph, for golden tests and the plan dump.
#pragma once

#include <string>

#include "graph/graph.h"

namespace loom::graph {

// Tensors first, then ops in execution order with their device, stage, layer and pieces.
std::string dump(const Graph& graph);

}  // namespace loom::graph
