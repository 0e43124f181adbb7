// The parts of the static equivalence proof (lower/equivalence.h), one file each.
#pragma once

#include <cstdint>
#include <string>

#include "core/result.h"
#include "graph/graph.h"
#include "lower/equivalence.h"
#include "lower/program.h"

namespace loom::lower::proof {

// "the adapter of 'x' for op1, op2", "the gather of parameter 'w' for op1": how errors name `a`.
std::string adapter_name(const graph::Graph& g, const Adapter& a);

// An error of rank `rank`'s program, naming it.
Error rank_error(int64_t rank, const std::string& why);

// The indices the rest of the proof follows, checked first so that a damaged plan is an error,
// never a crash.
Status check_structure(const graph::Graph& g, const Lowered& l, int64_t micro_batches);

// Each sub-operator against its single-device op, and each op's outputs written once.
Status check_ops(const graph::Graph& single, const graph::Graph& planned, ProofStats& stats);

}  // namespace loom::lower::proof
