// What training keeps per parameter element, counted once for every memory figure of loom: the
// plan estimate's per-rank peak (plan/estimate.cc), the auto-planner's memory floor
// (plan/auto_plan.cc) and the window policy's cost of a replicated weight
// (planner/window_policy.cc).
#pragma once

#include "core/run_spec.h"

namespace loom {

// Bytes per parameter element. Weights are kept in float32 (a bf16 run's master copy), so are
// their gradients and the optimizer's state: AdamW's two moments, SGD's one buffer, which
// runtime/optimizer.cc allocates with or without momentum.
struct TrainingStateBytes {
  double weight = 4;
  double grad = 4;
  double optimizer = 0;

  double total() const { return weight + grad + optimizer; }
};

inline TrainingStateBytes training_state_bytes(OptimizerKind optimizer) {
  TrainingStateBytes b;
  b.optimizer = optimizer == OptimizerKind::kAdamw ? 2 * b.weight : b.weight;
  return b;
}

}  // namespace loom
