#include "graph/ops_context.h"

#include "core/check.h"

namespace loom::graph {

void add_context_ops(OpRegistry& registry) {
  OpSchema block = OpSchema::simple(kRingAttentionStep, kRingAttentionStepAnnotation);
  block.attention_core = true;
  // Partial results merge in float32 whatever the activations' dtype: a bf16 log-sum-exp is off
  // by up to 2^-8 of its value, which the merge's exponentials turn into percent errors.
  block.fp32_outputs = true;
  OpSchema merge = OpSchema::simple(kLseMerge, kLseMergeAnnotation);
  OpSchema last = OpSchema::simple(kLseMergeLast, kLseMergeLastAnnotation);
  for (OpSchema* s : {&block, &merge, &last}) {
    Status st = registry.add(std::move(*s));
    LOOM_CHECK(st.ok()) << st.error().message;
  }
}

}  // namespace loom::graph
