// Runs one rank's lowered program: forward segments with adapters as autograd functions
// (their backward runs the gradient path), stage boundaries as explicit sends and receives of
// activations and gradients, then gradient synchronisation of replicated parameter pieces.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "exec/comm/comm.h"
#include "exec/lower/program.h"
#include "exec/runtime/kernels.h"
#include "graph/graph.h"

namespace loom::runtime {

class RankExecutor {
 public:
  // Creates the sub-groups every adapter and gradient sync needs (a collective over `world`:
  // every rank constructs its executor at the same point) and materialises this rank's
  // parameter pieces.
  static Result<std::unique_ptr<RankExecutor>> create(const graph::Graph& planned,
                                                      const lower::Lowered& lowered,
                                                      std::shared_ptr<comm::Comm> world,
                                                      const KernelRegistry& kernels, uint64_t seed);
  ~RankExecutor();

  // Forward and backward of every micro-batch in program order; `inputs[m]` holds the full
  // values of the graph inputs of micro-batch m by tensor id. Gradients are scaled by
  // `grad_scale` and synchronised. Returns the global loss summed over the micro-batches.
  Result<double> run(const std::vector<std::unordered_map<int64_t, at::Tensor>>& inputs,
                     double grad_scale);

  // This rank's parameter pieces (leaves with gradients after run()).
  const std::vector<at::Tensor>& parameters() const;
  const std::vector<graph::SubTensor>& parameter_pieces() const;
  // How many ranks hold each parameter piece (for a global norm that counts elements once).
  const std::vector<int64_t>& parameter_replicas() const;
  comm::Comm& world();

  struct Impl;  // opaque; public so the adapter autograd function can reach it

 private:
  explicit RankExecutor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::runtime
