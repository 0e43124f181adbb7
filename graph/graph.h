// The graph: FullTensors and the ops over them, in a valid execution order.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "graph/op.h"

namespace loom::graph {

class Graph {
 public:
  explicit Graph(std::string name = "graph") : name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  const std::vector<FullTensor>& tensors() const { return tensors_; }
  const std::vector<Op>& ops() const { return ops_; }
  std::vector<Op>& mutable_ops() { return ops_; }
  // Ids and names are fixed; everything else of a tensor (dtype, role) may change.
  FullTensor& mutable_tensor(TensorId id);

  const FullTensor& tensor(TensorId id) const;
  std::optional<TensorId> find_tensor(const std::string& name) const;
  const Op& op(OpId id) const;

  // Tensors of one role, in creation order.
  std::vector<TensorId> tensors_with_role(TensorRole role) const;
  TensorId loss() const { return loss_; }

  TensorId add_tensor(FullTensor t);  // assigns the id; names must be unique
  OpId add_op(Op op);                 // assigns the id; appended to the execution order
  // Marks `id` as the loss (its role becomes kLoss). Chimera's second pipeline adds a loss of
  // its own: every tensor with the loss role is a loss of some micro-batches.
  void set_loss(TensorId id);

 private:
  std::string name_;
  std::vector<FullTensor> tensors_;
  std::vector<Op> ops_;
  std::unordered_map<std::string, TensorId> by_name_;
  TensorId loss_;
};

}  // namespace loom::graph
