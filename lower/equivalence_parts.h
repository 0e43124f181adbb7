// The parts of the static equivalence proof (lower/equivalence.h), one file each.
#pragma once

#include "core/result.h"
#include "graph/graph.h"
#include "lower/equivalence.h"

namespace loom::lower::proof {

// Each sub-operator against its single-device op, and each op's outputs written once.
Status check_ops(const graph::Graph& single, const graph::Graph& planned, ProofStats& stats);

}  // namespace loom::lower::proof
