// The graph: FullTensors and the ops over them, in a valid execution order.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "graph/op.h"

namespace loom::graph {

// A value: copies are independent. A copy shares its tensors and ops with the original until
// either changes them (copy on write), because plans copy large planned graphs (a planned graph
// of a thousand ranks holds hundreds of thousands of sub-ops) far more often than they change
// them. A reference from tensors(), ops(), tensor() or op() stays valid while the graph lives
// and is not changed; one from mutable_ops() or mutable_tensor() is for changes made before the
// graph is next copied.
class Graph {
 public:
  explicit Graph(std::string name = "graph") : name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  const std::vector<FullTensor>& tensors() const;
  const std::vector<Op>& ops() const;
  std::vector<Op>& mutable_ops();
  // The op list emptied for a rewrite that rebuilds it from another graph's ops (the tensors
  // kept): what mutable_ops().clear() does, without copying ops a copy still shares.
  std::vector<Op>& reset_ops();
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
  struct TensorTable {
    std::vector<FullTensor> tensors;
    std::unordered_map<std::string, TensorId> by_name;
  };
  TensorTable& own_tensors();  // this graph's own table: copied first if a copy shares it

  std::string name_;
  // Null until the first tensor (or op) is added: an empty table (list).
  std::shared_ptr<TensorTable> tensors_;
  std::shared_ptr<std::vector<Op>> ops_;
  TensorId loss_;
};

}  // namespace loom::graph
