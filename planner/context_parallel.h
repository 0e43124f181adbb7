// Context parallelism's graph transforms: causal attention over a sequence split into cp chunks
// as ring attention, cp steps each pairing query chunk c with key chunk (c - k) mod cp, merged
// by their log-sum-exp; each step split over the cp ranks, so rank c computes attention for its
// own queries from the key/value chunk the rank k before it sends.
#pragma once

#include <cstdint>
#include <vector>

#include "core/result.h"
#include "graph/graph.h"

namespace loom::planner {

// Every causal attention op of the one-device graph `g` (attention, gqa_attention) replaced by
// cp ring_attention_step ops (graph/ops_context.h), the first writing new float32 tensors, each
// next merged into the running result by an lse_merge op, the last merge writing the attention's
// output. Fails, naming the op and parallel.cp, when the sequence does not split into cp chunks,
// or for attention that shares kv heads across tensor-parallel ranks (shared_kv_attention).
Result<graph::Graph> context_parallel_attention(const graph::Graph& g, int64_t cp);

// A ring_attention_step op (or a piece of one covering whole chunks) as its sub-ops per query
// chunk: chunk c reads query chunk c and key/value chunk (c - step) mod cp, and writes chunk c of
// the outputs; part c of cp.
std::vector<graph::Op> ring_step_parts(const graph::Op& op);

}  // namespace loom::planner
