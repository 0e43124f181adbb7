// Op types of vision models (Swin Transformer): patch embedding, windows, window attention with
// relative position bias, patch merging, pooling and the classification loss.
#pragma once

#include "graph/op_registry.h"

namespace loom::graph {

// Adds the vision op types to `registry` (with_builtin_ops calls it).
void add_vision_ops(OpRegistry& registry);

}  // namespace loom::graph
