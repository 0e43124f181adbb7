// Op types of mixture-of-experts layers. A token's route is a row of combine weights over the
// experts (its normalised gate on the experts it goes to, 0 elsewhere); the tokens an expert
// receives sit in a [batch, experts, capacity, hidden] buffer, sample by sample, in sequence
// order. The expert dimension is an annotated label like any other: expert parallelism splits it,
// and the all-to-all that carries tokens between the batch split and the expert split is the
// lowering's, not the model's.
#pragma once

#include "graph/op_registry.h"

namespace loom::graph {

// Router scores [b, s, e] -> combine weights [b, s, e], float32. Attributes: top_k; score
// ("softmax" over the experts, or "sigmoid" as DeepSeek-V3); normalize (1: the chosen experts'
// gates divided by their sum; default for top_k > 1 and for sigmoid); c: the capacity (slots
// per expert per sample; 0: none). With a capacity the tokens past it (in sequence order, per
// sample and expert) get weight 0: they are dropped, identically under every plan.
inline constexpr const char* kMoeRoute = "moe_route";
inline constexpr const char* kMoeRouteAnnotation = "b s^ e^ -> b s^ e^";
// Tokens [b, s, m] and combine weights [b, s, e] -> the experts' buffer [b, e, c, m]: the j-th
// token of sample i (in sequence order) with a non-zero weight for expert x sits at [i, x, j];
// unused slots are 0. Attribute c: the slots per expert (the sequence length when dropless).
inline constexpr const char* kMoeDispatch = "moe_dispatch";
inline constexpr const char* kMoeDispatchAnnotation = "b s^ m, b s^ e -> b e c^ m";
// One linear per expert: [b, e, c, k] x [e, n, k] -> [b, e, c, n] (no bias: a zero slot stays 0).
inline constexpr const char* kExpertLinear = "expert_linear";
inline constexpr const char* kExpertLinearAnnotation = "b e c k+, e n k+ -> b e c n";
// The experts' outputs [b, e, c, m] back to their tokens, weighted: out[i, t] = sum over experts
// x of weight[i, t, x] * buffer[i, x, slot of t]. Splitting the experts gives partial sums.
inline constexpr const char* kMoeCombine = "moe_combine";
inline constexpr const char* kMoeCombineAnnotation = "b e+ c^ m, b s^ e+ -> b s^ m";
// Load statistics of the router scores [b, s, e] (attributes top_k, score): per expert, the
// number of tokens that chose it (before any capacity) and the sum of its normalised score.
// Sums over tokens, so splitting the batch or the sequence gives partial sums.
inline constexpr const char* kMoeLoadStats = "moe_load_stats";
inline constexpr const char* kMoeLoadStatsAnnotation = "b+ s+ e^ -> e^, e^";
// The load-balancing loss of Switch Transformer / GShard from those sums: coef * E / (k T^2) *
// sum_x count_x * score_x, which is coef * E * sum_x f_x P_x with f_x the fraction of the T
// tokens' k choices that went to x and P_x its mean score (attributes coef, experts E, top_k k,
// tokens T: those of the micro-batch).
inline constexpr const char* kMoeAuxLoss = "moe_aux_loss";
inline constexpr const char* kMoeAuxLossAnnotation = "e+, e+ -> ";
// The sum of two scalar losses (the model's and an auxiliary one).
inline constexpr const char* kAddLoss = "add_loss";
inline constexpr const char* kAddLossAnnotation = ", -> ";

// Adds them to `registry` (with_builtin_ops calls it).
void add_moe_ops(OpRegistry& registry);

}  // namespace loom::graph
