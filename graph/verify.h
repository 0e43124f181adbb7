// The graph verifier: run after building and after every transform (in tests and debug runs).
#pragma once

#include <vector>

#include "core/result.h"
#include "graph/graph.h"
#include "graph/op_registry.h"

namespace loom::graph {

// Checks that every op's pieces satisfy its annotation (sizes agree label by label), that every
// tensor an op reads is a graph input or parameter or is written by an earlier op, and that the
// graph has a scalar loss. The error names the op and the tensor.
Status verify(const Graph& graph, const OpRegistry& registry);
// The same without looking op types up (a transform keeps the types of the ops it rewrites).
Status verify(const Graph& graph);

// The checks of one op on its own: as many pieces as its annotation has tensors, each input
// piece inside its tensor, each output piece of the shape the annotation gives the inputs.
Status verify_op(const Graph& graph, const Op& op);

// Whether the pieces `have` of one FullTensor hold enough to make the piece `want` (by slicing
// and summing value chunks).
bool coverable(const SubTensor& want, const std::vector<const SubTensor*>& have);

}  // namespace loom::graph
