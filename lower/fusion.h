// Which ops the executor runs as one kernel with the op after them: a linear whose output only
// the next op of its segment, a bias_add on the same rank, reads, with nothing moving that output
// between ranks and no partial sum to complete first, runs with it as one at::linear. The IR
// keeps the two apart (a row-parallel split must leave the linear's output a partial sum); the
// executor fuses them, and the estimator counts no output for the fused linear.
#pragma once

#include <vector>

#include "graph/graph.h"
#include "lower/program.h"

namespace loom::lower {

// Per op of `planned`: true when it runs fused into the next op of its segment.
std::vector<bool> fused_into_next(const graph::Graph& planned, const Lowered& lowered);

}  // namespace loom::lower
