// Optimizers over local parameter pieces: AdamW and SGD (momentum), global-norm clipping.
// AdamW runs as one fused pass per tensor on the CPU, LibTorch's fused kernel on CUDA (>= 2.1),
// else multi-tensor (`_foreach_*`) ops.
// Weight decay applies to matrices only (not to biases and norm gains), as in GPT training.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "core/config.h"
#include "core/run_spec.h"

namespace loom::runtime {

class Optimizer {
 public:
  // `params` must have gradients when step() runs; `decay[i]` says whether params[i] decays.
  // Only elements [begin, end) of each flattened piece given in `owned` (all when empty) keep
  // state and are updated: under parallel.zero 1 other ranks own the rest (grad_buckets.h).
  // `kind` is the plan's (PlanSpec::optimizer); `config` gives its hyperparameters.
  Optimizer(OptimizerKind kind, OptimizerConfig config, std::vector<at::Tensor> params,
            std::vector<bool> decay, std::vector<std::pair<int64_t, int64_t>> owned = {});

  // One update with learning rate `lr`.
  void step(double lr);
  int64_t steps_taken() const { return t_; }

  // The state a checkpoint saves, per parameter: the first moment (AdamW) or momentum buffer
  // (SGD), and the second moment (AdamW only; empty for SGD). Loading writes into them. A piece
  // owned whole has state of its shape; one owned in part, a 1-D state of its owned elements
  // (owned()); one not owned at all, undefined state.
  const std::vector<at::Tensor>& exp_avg() const { return exp_avg_; }
  const std::vector<at::Tensor>& exp_avg_sq() const { return exp_avg_sq_; }
  void set_steps_taken(int64_t t) { t_ = t; }
  OptimizerKind kind() const { return kind_; }
  // Per piece: the elements [begin, end) of the flattened piece this optimizer updates.
  const std::vector<std::pair<int64_t, int64_t>>& owned() const { return owned_; }

 private:
  void adamw_step(double lr);
  void sgd_step(double lr);

  OptimizerKind kind_;
  OptimizerConfig config_;
  std::vector<at::Tensor> params_;
  std::vector<bool> decay_;
  std::vector<std::pair<int64_t, int64_t>> owned_;
  // What step() updates of piece i: the piece, or its owned elements (a 1-D view).
  at::Tensor target(size_t i) const;
  at::Tensor target_grad(size_t i) const;
  std::vector<at::Tensor> exp_avg_;     // AdamW first moment / SGD momentum buffer
  std::vector<at::Tensor> exp_avg_sq_;  // AdamW second moment
  int64_t t_ = 0;
};

// The L2 norm of all gradients together (sum of squares of local pieces, as given).
double grad_norm_squared(const std::vector<at::Tensor>& params);
// Scales every gradient so the global norm is at most max_norm (as torch's clip_grad_norm_).
void clip_gradients(const std::vector<at::Tensor>& params, double total_norm, double max_norm);

}  // namespace loom::runtime
