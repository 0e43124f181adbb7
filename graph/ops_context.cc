#include "graph/ops_context.h"

#include "core/check.h"

namespace loom::graph {

OpSchema ring_attention_step_schema() {
  OpSchema block = OpSchema::simple(kRingAttentionStep, kRingAttentionStepAnnotation);
  block.attention_core = true;
  // Partial results merge in float32 whatever the activations' dtype: a bf16 log-sum-exp is off
  // by up to 2^-8 of its value, which the merge's exponentials turn into percent errors.
  block.fp32_outputs = true;
  // Its query chunk's scores and sums, as gqa_attention's; tensor parallelism splits the kv
  // groups.
  block.rules.flops = flops_of_labels(4, {"b", "s", "t", "g", "r", "d"});
  block.rules.tensor_parallel = tp_split("g");
  return block;
}

OpSchema lse_merge_schema(bool last) {
  OpSchema merge = last ? OpSchema::simple(kLseMergeLast, kLseMergeLastAnnotation)
                        : OpSchema::simple(kLseMerge, kLseMergeAnnotation);
  merge.rules.tensor_parallel = tp_split("h");  // the heads, as the attention it merges
  return merge;
}

void add_context_ops(OpRegistry& registry) {
  for (OpSchema s :
       {ring_attention_step_schema(), lse_merge_schema(false), lse_merge_schema(true)}) {
    Status st = registry.add(std::move(s));
    LOOM_CHECK(st.ok()) << st.error().message;
  }
}

}  // namespace loom::graph
