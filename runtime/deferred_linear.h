// The split backward of zero-bubble schedules (ZB-H1): a parameter's matrix product x·Wᵀ whose
// backward gives the input gradient (and the bias's, an element-wise sum) at once but leaves the
// weight gradient, the second matrix product of a linear's backward, for later. The backward
// stashes (input, output gradient) instead; the schedule's W block computes grad W = gᵀ·x from
// the stash and accumulates it. No part of the backward runs twice: the I block does what a full
// backward does minus those matrix products, the W block only them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <vector>

#include "runtime/linear.h"

namespace loom::runtime {

// The weight-gradient work deferred by the backward of one stage on one micro-batch.
class WeightGradStash {
 public:
  struct Entry {
    int64_t param = 0;       // the caller's parameter slot
    at::Tensor input;        // x, as the forward read it
    at::Tensor grad_output;  // the gradient of x·Wᵀ
    LinearMath math = LinearMath::kDefault;
  };
  void add(Entry e) { entries_.push_back(std::move(e)); }
  int64_t size() const { return static_cast<int64_t>(entries_.size()); }
  // Per parameter slot, the sum of its deferred weight gradients in float32 (the masters'
  // dtype), computed now; the stash is empty afterwards.
  std::map<int64_t, at::Tensor> take_weight_grads();

 private:
  std::vector<Entry> entries_;
};

// at::linear(x, weight, bias) (bias may be undefined) whose backward stashes the weight
// gradient's operands in `stash` under `param` instead of computing it: `weight` gets no
// gradient from autograd (it is not an input of the autograd graph), x and bias get theirs.
// `stash` must outlive the backward.
at::Tensor deferred_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           WeightGradStash& stash, int64_t param,
                           LinearMath math = LinearMath::kDefault);

}  // namespace loom::runtime
