#include "graph/graph.h"

#include "core/check.h"

namespace loom::graph {

const FullTensor& Graph::tensor(TensorId id) const {
  LOOM_CHECK(id.valid() && id.value() < static_cast<int64_t>(tensors_.size()))
      << "no tensor " << id << " in graph " << name_;
  return tensors_[id.value()];
}

FullTensor& Graph::mutable_tensor(TensorId id) {
  LOOM_CHECK(id.valid() && id.value() < static_cast<int64_t>(tensors_.size()))
      << "no tensor " << id << " in graph " << name_;
  return tensors_[id.value()];
}

std::optional<TensorId> Graph::find_tensor(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

const Op& Graph::op(OpId id) const {
  LOOM_CHECK(id.valid() && id.value() < static_cast<int64_t>(ops_.size()))
      << "no op " << id << " in graph " << name_;
  return ops_[id.value()];
}

std::vector<TensorId> Graph::tensors_with_role(TensorRole role) const {
  std::vector<TensorId> out;
  for (const auto& t : tensors_)
    if (t.role == role) out.push_back(t.id);
  return out;
}

TensorId Graph::add_tensor(FullTensor t) {
  LOOM_CHECK(!by_name_.count(t.name)) << "duplicate tensor name '" << t.name << "'";
  t.id = TensorId(static_cast<int64_t>(tensors_.size()));
  by_name_.emplace(t.name, t.id);
  tensors_.push_back(std::move(t));
  return tensors_.back().id;
}

OpId Graph::add_op(Op op) {
  op.id = OpId(static_cast<int64_t>(ops_.size()));
  ops_.push_back(std::move(op));
  return ops_.back().id;
}

}  // namespace loom::graph

namespace loom::graph {

std::string Op::name() const {
  std::string n = def->name;
  for (const Part& p : parts)
    n += "[" + std::to_string(p.index) + "/" + std::to_string(p.count) + "]";
  return n;
}

void Graph::set_loss(TensorId id) {
  LOOM_CHECK(id.valid() && id.value() < static_cast<int64_t>(tensors_.size()))
      << "no tensor " << id;
  loss_ = id;
  tensors_[static_cast<size_t>(id.value())].role = TensorRole::kLoss;
}

}  // namespace loom::graph
