// Op types of a language model's loss in vocabulary groups: mean token cross-entropy written so
// that tensor parallelism can split the vocabulary like the LM head. The IR keeps the four ops
// apart; a rank that holds the whole vocabulary runs them as one cross-entropy (lower/fusion.h).
#pragma once

#include <cstdint>

#include "graph/builder.h"

namespace loom::graph {

// Logits [b, s, g*v] -> each group's log-sum-exp [b, s, g] (attribute v: the group's width).
inline constexpr const char* kGroupLogSumExp = "group_logsumexp";
// The groups' log-sum-exps [b, s, g] -> each token's [b, s].
inline constexpr const char* kLogSumExp = "logsumexp";
// Logits [b, s, g*v] and targets [b, s] -> each token's target logit (0 where a piece of the
// vocabulary does not hold it, so pieces are partial sums). Attribute v as group_logsumexp's.
inline constexpr const char* kPick = "pick";
// Log-sum-exps and target logits [b, s] -> the sum of their differences over `normalizer`.
inline constexpr const char* kNll = "nll";

// The loss of `logits` [b, s, vocab] against `targets` [b, s] in groups of `group_width`
// entries: the four ops above, named loss.group_lse, loss.lse, loss.target and loss; returns the
// loss (the token losses' sum over `normalizer`). With `valid` > 0 the logits' columns from
// `valid` on are padding (a vocabulary padded for tensor parallelism): attribute valid on
// group_logsumexp and nll leaves them out of the log-sum-exp, as if the vocabulary ended there.
TensorId vocab_group_loss(GraphBuilder& b, TensorId logits, TensorId targets, int64_t group_width,
                          int64_t normalizer, int64_t valid = 0);

}  // namespace loom::graph
