// Which exchanges of a lowered plan run inside a backward pass, where the autograd engine, not
// the rank's own thread, waits for them: an adapter within a stage whose gradient path moves
// data between devices (its forward path then does too, run again by recomputation) and
// parallel.zero 3's parameter gathers. Pipeline transfers between stages and the data-parallel
// gradient sums run outside.
#pragma once

#include <optional>
#include <string>

#include "graph/graph.h"
#include "lower/program.h"

namespace loom::lower {

// The first such exchange of any rank, named for a message ("the all_reduce of tensor 'h1' read
// by 'attn.proj'"); nullopt when every exchange runs outside the backward passes.
std::optional<std::string> exchange_in_backward(const graph::Graph& graph, const Lowered& lowered);

}  // namespace loom::lower
