// Which ops the executor runs as one kernel with the op after them: a linear whose output only
// the next op of its segment, a bias_add on the same rank, reads, with nothing moving that output
// between ranks and no partial sum to complete first, runs with it as one at::linear. The IR
// keeps the two apart (a row-parallel split must leave the linear's output a partial sum); the
// executor fuses them, and the estimator counts no output for the fused linear. Likewise a
// loss chain that sees the whole vocabulary on its rank runs as one cross-entropy (FusedLoss).
#pragma once

#include <cstdint>
#include <vector>

#include "graph/graph.h"
#include "lower/program.h"

namespace loom::lower {

// Per op of `planned`: true when it runs fused into the next op of its segment.
std::vector<bool> fused_into_next(const graph::Graph& planned, const Lowered& lowered);

// A vocabulary-group loss chain (graph/builtin_ops.cc: group_logsumexp, logsumexp, pick, nll)
// that runs on its rank as one cross-entropy kernel (log-softmax and the target's
// log-probability): the IR keeps the four apart so tensor parallelism can split the vocabulary,
// but a rank that holds the whole vocabulary of its tokens, with nothing communicated between
// the four, needs none of the pieces. The four are consecutive items of one segment.
struct FusedLoss {
  // Op indices in the planned graph.
  int64_t group_lse = -1;
  int64_t lse = -1;
  int64_t pick = -1;
  int64_t nll = -1;
  int64_t first = -1;  // the op whose item comes first in the segment
};

// The loss chains of `planned` that run fused, over every rank's program.
std::vector<FusedLoss> fused_losses(const graph::Graph& planned, const Lowered& lowered);

// Both of a lowered plan. They read the ops, the adapters and the segments' items, which
// neither the pipeline's order nor recomputation changes: plans that share a lowering
// (plan::PlanCache) share them.
struct Fusion {
  std::vector<bool> into_next;    // fused_into_next
  std::vector<FusedLoss> losses;  // fused_losses
};
Fusion fusion_of(const graph::Graph& planned, const Lowered& lowered);

}  // namespace loom::lower
