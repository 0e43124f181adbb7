// Runs a graph's ops on this process with LibTorch kernels under autograd.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "exec/runtime/kernels.h"
#include "graph/graph.h"

namespace loom::runtime {

class Executor {
 public:
  // Materialises every parameter piece the graph's ops read (seeded per FullTensor).
  Executor(const graph::Graph& graph, const KernelRegistry& kernels, uint64_t seed);

  // Runs the forward pass of one micro-batch; `inputs` holds one tensor per graph input, by id.
  // Returns the loss (with its autograd graph). Fails naming the op whose kernel is missing.
  at::Tensor forward(const std::unordered_map<int64_t, at::Tensor>& inputs) const;
  // The same, returning the value of every tensor by id (inputs, parameters, activations).
  // Fusion skips intermediate values; `every_value` runs op by op so all of them are kept.
  std::vector<at::Tensor> forward_all(const std::unordered_map<int64_t, at::Tensor>& inputs,
                                      bool every_value = true) const;

  const std::vector<at::Tensor>& parameters() const { return params_; }
  const std::vector<TensorId>& parameter_ids() const { return param_ids_; }
  // The parameter piece of FullTensor `name`; undefined when this rank holds none.
  at::Tensor parameter(const std::string& name) const;
  void zero_grad();

 private:
  // One unit of work: an op, or a linear whose only reader is the bias_add that follows it,
  // run as one at::linear (the IR keeps them apart so row-parallel splits stay partial sums).
  struct Step {
    size_t op;
    int64_t fused_bias = -1;  // index of the fused bias_add op
  };

  const graph::Graph& graph_;
  std::vector<const Kernel*> kernels_;  // per op
  std::vector<Step> steps_;
  std::vector<Step> unfused_steps_;
  std::vector<at::Tensor> params_;  // leaves, requires_grad
  std::vector<TensorId> param_ids_;
  std::vector<int64_t> param_slot_;  // tensor id -> index in params_, or -1
};

}  // namespace loom::runtime
