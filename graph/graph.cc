#include "graph/graph.h"

#include <atomic>

#include "core/check.h"

namespace loom::graph {
namespace {

// `part`, owned by its holder alone: made when null, copied when another graph shares it.
template <typename T>
T& unshared(std::shared_ptr<T>& part) {
  if (!part) {
    part = std::make_shared<T>();
  } else if (part.use_count() > 1) {
    part = std::make_shared<T>(*part);
  } else {
    // The last other owner may have dropped it on another thread after reading it: its reads
    // happen before this graph writes.
    std::atomic_thread_fence(std::memory_order_acquire);
  }
  return *part;
}

const std::vector<FullTensor>& no_tensors() {
  static const std::vector<FullTensor> none;
  return none;
}

const std::vector<Op>& no_ops() {
  static const std::vector<Op> none;
  return none;
}

}  // namespace

const std::vector<FullTensor>& Graph::tensors() const {
  return tensors_ ? tensors_->tensors : no_tensors();
}

const std::vector<Op>& Graph::ops() const { return ops_ ? *ops_ : no_ops(); }

std::vector<Op>& Graph::mutable_ops() { return unshared(ops_); }

std::vector<Op>& Graph::reset_ops() {
  if (ops_ && ops_.use_count() == 1) {
    std::atomic_thread_fence(std::memory_order_acquire);
    ops_->clear();
  } else {
    ops_ = std::make_shared<std::vector<Op>>();
  }
  return *ops_;
}

Graph::TensorTable& Graph::own_tensors() { return unshared(tensors_); }

const FullTensor& Graph::tensor(TensorId id) const {
  const std::vector<FullTensor>& all = tensors();
  LOOM_CHECK(id.valid() && id.value() < static_cast<int64_t>(all.size()))
      << "no tensor " << id << " in graph " << name_;
  return all[static_cast<size_t>(id.value())];
}

FullTensor& Graph::mutable_tensor(TensorId id) {
  LOOM_CHECK(id.valid() && id.value() < static_cast<int64_t>(tensors().size()))
      << "no tensor " << id << " in graph " << name_;
  return own_tensors().tensors[static_cast<size_t>(id.value())];
}

std::optional<TensorId> Graph::find_tensor(const std::string& name) const {
  if (!tensors_) return std::nullopt;
  auto it = tensors_->by_name.find(name);
  if (it == tensors_->by_name.end()) return std::nullopt;
  return it->second;
}

const Op& Graph::op(OpId id) const {
  const std::vector<Op>& all = ops();
  LOOM_CHECK(id.valid() && id.value() < static_cast<int64_t>(all.size()))
      << "no op " << id << " in graph " << name_;
  return all[static_cast<size_t>(id.value())];
}

std::vector<TensorId> Graph::tensors_with_role(TensorRole role) const {
  std::vector<TensorId> out;
  for (const auto& t : tensors())
    if (t.role == role) out.push_back(t.id);
  return out;
}

TensorId Graph::add_tensor(FullTensor t) {
  LOOM_CHECK(!find_tensor(t.name)) << "duplicate tensor name '" << t.name << "'";
  TensorTable& table = own_tensors();
  t.id = TensorId(static_cast<int64_t>(table.tensors.size()));
  table.by_name.emplace(t.name, t.id);
  table.tensors.push_back(std::move(t));
  return table.tensors.back().id;
}

OpId Graph::add_op(Op op) {
  std::vector<Op>& ops = mutable_ops();
  op.id = OpId(static_cast<int64_t>(ops.size()));
  ops.push_back(std::move(op));
  return ops.back().id;
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
  LOOM_CHECK(id.valid() && id.value() < static_cast<int64_t>(tensors().size()))
      << "no tensor " << id;
  loss_ = id;
  own_tensors().tensors[static_cast<size_t>(id.value())].role = TensorRole::kLoss;
}

}  // namespace loom::graph
