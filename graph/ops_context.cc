#include "graph/ops_context.h"

#include <algorithm>

#include "core/check.h"

namespace loom::graph {

std::vector<SequenceRun> sequence_runs(int64_t begin, int64_t end, int64_t seq, int64_t halves) {
  std::vector<SequenceRun> out;
  if (end <= begin) return out;
  if (halves <= 0) return {SequenceRun{begin, begin, end - begin}};
  LOOM_CHECK(halves % 2 == 0 && seq % halves == 0)
      << "zigzag order over " << halves << " halves of a sequence of " << seq << " positions";
  const int64_t half = seq / halves;
  for (int64_t i = begin; i < end;) {
    const int64_t j = i / half, chunk = j / 2;
    const int64_t original = j % 2 == 0 ? chunk : halves - 1 - chunk;
    const int64_t next = std::min(end, (j + 1) * half);
    out.push_back(SequenceRun{i, original * half + i % half, next - i});
    i = next;
  }
  return out;
}

std::vector<AttentionBlock> ring_step_blocks(const Op& op) {
  const Attrs& a = op.attrs();
  const int64_t cp = a.get<int64_t>("cp"), step = a.get<int64_t>("cp_step");
  const int64_t seq = a.get<int64_t>("seq");
  const int64_t halves = a.get_or<int64_t>("zigzag", 0);
  const int64_t len = seq / cp;
  const Range q = op.inputs[0].ranges[1];
  std::vector<AttentionBlock> out;
  for (int64_t c = q.start / len; c < q.end / len; ++c) {
    const int64_t kc = ((c - step) % cp + cp) % cp;
    const auto keys = sequence_runs(kc * len, (kc + 1) * len, seq, halves);
    for (const SequenceRun& qr : sequence_runs(c * len, (c + 1) * len, seq, halves))
      for (const SequenceRun& kr : keys)
        if (kr.position <= qr.position + qr.len - 1)
          out.push_back(AttentionBlock{qr, kr, kr.position + kr.len - 1 > qr.position});
  }
  return out;
}

OpSchema ring_attention_step_schema() {
  OpSchema block = OpSchema::simple(kRingAttentionStep, kRingAttentionStepAnnotation);
  block.attention_core = true;
  // Partial results merge in float32 whatever the activations' dtype: a bf16 log-sum-exp is off
  // by up to 2^-8 of its value, which the merge's exponentials turn into percent errors.
  block.fp32_outputs = true;
  // The scores and sums of the blocks it computes (ring_step_blocks: those with a key at or
  // before a query), as gqa_attention's over them; tensor parallelism splits the kv groups.
  const FlopsRule whole = flops_of_labels(4, {"b", "s", "t", "g", "r", "d"});
  block.rules.flops = [whole](const FlopsInput& in) {
    if (!in.op) return whole(in);
    double pairs = 0;
    for (const AttentionBlock& b : ring_step_blocks(*in.op))
      pairs += static_cast<double>(b.q.len) * static_cast<double>(b.k.len);
    return 4.0 * in("b") * pairs * in("g") * in("r") * in("d");
  };
  block.rules.flops_by_position = true;
  block.rules.tensor_parallel = tp_split("g");
  block.rules.saved_bytes = ring_step_saved_bytes();
  return block;
}

OpSchema lse_merge_schema(bool last) {
  OpSchema merge = last ? OpSchema::simple(kLseMergeLast, kLseMergeLastAnnotation)
                        : OpSchema::simple(kLseMerge, kLseMergeAnnotation);
  merge.rules.tensor_parallel = tp_split("h");  // the heads, as the attention it merges
  return merge;
}

OpSchema seq_permute_schema(bool rows) {
  OpSchema permute = rows ? OpSchema::simple(kSeqPermuteRows, kSeqPermuteRowsAnnotation)
                          : OpSchema::simple(kSeqPermute, kSeqPermuteAnnotation);
  // A permutation keeps its input's dtype (token ids are integers).
  permute.infer_dtypes = [](const std::vector<DType>& in, const Attrs&) { return in; };
  return permute;
}

void add_context_ops(OpRegistry& registry) {
  for (OpSchema s : {ring_attention_step_schema(), lse_merge_schema(false), lse_merge_schema(true),
                     seq_permute_schema(false), seq_permute_schema(true)}) {
    Status st = registry.add(std::move(s));
    LOOM_CHECK(st.ok()) << st.error().message;
  }
}

}  // namespace loom::graph
