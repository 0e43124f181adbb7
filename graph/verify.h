// The graph verifier: run after building and after every transform (in tests and debug runs).
#pragma once

#include "core/result.h"
#include "graph/graph.h"
#include "graph/op_registry.h"

namespace loom::graph {

// Checks that every op's pieces satisfy its annotation (sizes agree label by label), that every
// tensor an op reads is a graph input or parameter or is written by an earlier op, and that the
// graph has a scalar loss. The error names the op and the tensor.
Status verify(const Graph& graph, const OpRegistry& registry);

}  // namespace loom::graph
