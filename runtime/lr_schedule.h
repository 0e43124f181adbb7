// Learning rate per step: linear warm-up, then constant, cosine or linear decay to min_lr.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/config.h"

namespace loom::runtime {

// The rate of optimizer step `step` (0-based) out of `total_steps`.
inline double lr_at(const OptimizerConfig& o, int64_t step, int64_t total_steps) {
  if (step < o.warmup_steps)
    return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  if (o.schedule == "constant") return o.lr;
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - o.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup_steps) / span);
  if (o.schedule == "cosine")
    return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(M_PI * progress));
  return o.lr + (o.min_lr - o.lr) * progress;  // linear
}

}  // namespace loom::runtime
