// Context parallelism's graph transforms: causal attention over a sequence split into cp chunks
// as ring attention, cp steps each pairing query chunk c with key chunk (c - k) mod cp, merged
// by their log-sum-exp; each step split over the cp ranks, so rank c computes attention for its
// own queries from the key/value chunk the rank k before it sends. In zigzag order
// (graph/ops_context.h) chunk c holds the sequence's halves c and 2cp - 1 - c, so under the
// causal mask every rank computes the same blocks at every step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"
#include "graph/graph.h"
#include "planner/space_spec.h"

namespace loom::planner {

// The order of the sequence over the cp ranks.
enum class CpOrder { kContiguous, kZigzag };
// The order of ring attention's sequence: p2p-contiguous in order, p2p (the default) in zigzag
// order.
CpOrder cp_order(CpKind kind);

// Every causal attention op of the one-device graph `g` (attention, gqa_attention) replaced by
// cp ring_attention_step ops (graph/ops_context.h), the first writing new float32 tensors, each
// next merged into the running result by an lse_merge op, the last merge writing the attention's
// output. In zigzag order the model also runs permuted: each sequence input (a graph input of
// the attention's sequence length at dimension 1: token ids, targets) is read through a
// seq_permute op and each table of positions (add_position's) through a seq_permute_rows op,
// and the ring steps and rope ops take attribute zigzag. Fails, naming the op and parallel.cp,
// when the sequence does not split into cp chunks (2 cp halves in zigzag order), for attention
// that shares kv heads across tensor-parallel ranks (shared_kv_attention), and in zigzag order
// for a mixture of experts with a capacity (it drops tokens in sequence order).
Result<graph::Graph> context_parallel_attention(const graph::Graph& g, int64_t cp,
                                                CpOrder order = CpOrder::kZigzag);

// A ring_attention_step op (or a piece of one covering whole chunks) as its sub-ops per query
// chunk: chunk c reads query chunk c and key/value chunk (c - step) mod cp, and writes chunk c of
// the outputs; part c of cp.
std::vector<graph::Op> ring_step_parts(const graph::Op& op);

}  // namespace loom::planner
