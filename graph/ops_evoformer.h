// The op types of the AlphaFold2 Evoformer (models/evoformer.h): axial attention along rows or
// columns of a 2-D representation, the outer product mean and the triangle multiplications.
// Their kernels live in runtime/kernels_evoformer.cc.
#pragma once

#include "graph/op_registry.h"

namespace loom::graph {

// Adds the Evoformer op types to `registry`; OpRegistry::with_builtin_ops() calls it.
void add_evoformer_ops(OpRegistry& registry);

}  // namespace loom::graph
