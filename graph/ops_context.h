// Op types of context parallelism (planner/context_parallel.h puts them in place of attention):
// one step of ring attention, and the merge of two partial attentions by their log-sum-exp.
#pragma once

#include "graph/op_registry.h"

namespace loom::graph {

// Step k of ring attention over a sequence in N chunks (attributes cp = N, cp_step = k; d; r:
// query heads per kv head, 1 for multi-head attention): query chunk c attends, causally, to key
// chunk (c - k) mod N, which lies after it for k > c (nothing to see: output 0, log-sum-exp
// -inf). Queries [b, s, (g r d)], keys and values [b, t, (g d)]; outputs the step's attention
// output and each query's log-sum-exp of its scores [b, s, (g r)], both float32. Context
// parallelism runs chunk c on cp rank c, the key chunk sent from the rank holding it.
inline constexpr const char* kRingAttentionStep = "ring_attention_step";
inline constexpr const char* kRingAttentionStepAnnotation =
    "b s^ (g r^ d^), b t^ (g d^), b t^ (g d^) -> b s^ (g r^ d^), b s^ (g r^)";
// Two partial attentions (output, log-sum-exp) of the same queries over disjoint keys -> those
// over the union: lse = log(e^lse1 + e^lse2), out = out1 e^(lse1 - lse) + out2 e^(lse2 - lse)
// (attribute d).
inline constexpr const char* kLseMerge = "lse_merge";
inline constexpr const char* kLseMergeAnnotation =
    "b s (h d^), b s h, b s (h d^), b s h -> b s (h d^), b s h";
// The last merge of a ring: the output alone (a log-sum-exp nothing reads would leave an
// undefined gradient in the backward).
inline constexpr const char* kLseMergeLast = "lse_merge_last";
inline constexpr const char* kLseMergeLastAnnotation =
    "b s (h d^), b s h, b s (h d^), b s h -> b s (h d^)";

// Their registry entries: context parallelism (planner/context_parallel.h) makes its ops from
// them; `last`: lse_merge_last.
OpSchema ring_attention_step_schema();
OpSchema lse_merge_schema(bool last);

// Adds them to `registry` (with_builtin_ops calls it).
void add_context_ops(OpRegistry& registry);

}  // namespace loom::graph
