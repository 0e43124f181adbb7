// Op types of context parallelism (planner/context_parallel.h puts them in place of attention):
// one step of ring attention, and the merge of two partial attentions by their log-sum-exp.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/op.h"
#include "graph/op_registry.h"

namespace loom::graph {

// Step k of ring attention over a sequence of `seq` positions in N chunks (attributes cp = N,
// cp_step = k, seq; d; r: query heads per kv head, 1 for multi-head attention; zigzag, below):
// query chunk c attends, causally, to key chunk (c - k) mod N; where those keys all lie after
// the queries there is nothing to see (output 0, log-sum-exp -inf). Queries [b, s, (g r d)],
// keys and values [b, t, (g d)]; outputs the step's attention output and each query's
// log-sum-exp of its scores [b, s, (g r)], both float32. Context parallelism runs chunk c on cp
// rank c, the key chunk sent from the rank holding it.
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
OpSchema seq_permute_schema(bool rows);  // rows: seq_permute_rows

// Zigzag order (attribute zigzag = 2N on the ops that know positions: ring_attention_step, rope,
// seq_permute, seq_permute_rows; 0 or absent: the sequence in order). The sequence is cut into
// 2N halves of seq / 2N positions and laid out so that chunk c of N holds halves c and
// 2N - 1 - c: under a causal mask every chunk then sees the same share of the keys before it
// (Megatron-Core's and ring-flash-attention's load balance). The model runs in that order from
// its inputs on; only position-aware ops map an index back to its position.
//
// Indices [at, at + len) of the zigzag order hold positions [position, position + len).
struct SequenceRun {
  int64_t at = 0, position = 0, len = 0;
  bool operator==(const SequenceRun& o) const {
    return at == o.at && position == o.position && len == o.len;
  }
};
// Indices [begin, end) of a sequence of `seq` positions in zigzag order over `halves` pieces
// (0: in order, one run) as runs of consecutive positions, one per half they touch.
std::vector<SequenceRun> sequence_runs(int64_t begin, int64_t end, int64_t seq, int64_t halves);

// A (query run, key run) pair a ring attention step computes: the keys are not all after the
// queries. `diagonal`: the same positions, so the causal mask cuts through the block.
struct AttentionBlock {
  SequenceRun q, k;
  bool diagonal = false;
};
// The blocks of a ring_attention_step op (or a piece of one covering whole query chunks), in
// query order: for each query chunk, each run of it against each run of its key chunk that has
// a key at or before a query. What the kernel computes and the estimator counts.
std::vector<AttentionBlock> ring_step_blocks(const Op& op);

// The token ids (or targets) of a sample in zigzag order: [b, s] -> [b, s], index i holding the
// id at position i's original place (attribute zigzag). Context parallelism puts one after each
// sequence input of the model.
inline constexpr const char* kSeqPermute = "seq_permute";
inline constexpr const char* kSeqPermuteAnnotation = "b s^ -> b s^";
// The rows of a table indexed by position (GPT's learned positions) in zigzag order: [s, h].
inline constexpr const char* kSeqPermuteRows = "seq_permute_rows";
inline constexpr const char* kSeqPermuteRowsAnnotation = "s^ h -> s^ h";

// Adds them to `registry` (with_builtin_ops calls it).
void add_context_ops(OpRegistry& registry);

}  // namespace loom::graph
