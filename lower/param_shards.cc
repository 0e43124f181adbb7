#include "lower/param_shards.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

namespace loom::lower {

int64_t shard_dim(const Shape& piece_shape, int64_t replicas) {
  for (size_t k = 0; k < piece_shape.size(); ++k)
    if (piece_shape[k] >= replicas && piece_shape[k] % replicas == 0)
      return static_cast<int64_t>(k);
  return -1;
}

std::map<std::pair<int64_t, std::string>, const Adapter*> parameter_adapters(const Lowered& l) {
  std::map<std::pair<int64_t, std::string>, const Adapter*> out;
  for (const Adapter& a : l.adapters)
    if (a.parameter) out[{a.tensor.value(), a.consumer}] = &a;
  return out;
}

graph::SubTensor stored_piece(const Adapter& a, DeviceId device, const Shape& shape) {
  const auto pos = std::find(a.from.devices.begin(), a.from.devices.end(), device);
  LOOM_CHECK(pos != a.from.devices.end())
      << "device " << device.value() << " stores no piece of " << a.from.to_string();
  return a.from.piece(pos - a.from.devices.begin(), a.tensor, shape);
}

namespace {

using graph::SubTensor;

// The readers of one parameter: per reading op (by its name), the ops' indices and the
// (device, piece) pairs they read.
struct Readers {
  std::vector<std::string> names;  // in the order of first read
  std::map<std::string, std::vector<size_t>> ops;
  std::map<std::string, std::vector<std::pair<DeviceId, SubTensor>>> pieces;
  std::set<int64_t> stages;
  std::map<std::string, bool> linear_weight;  // the op is a weight product reading it as its weight
};

std::map<int64_t, Readers> readers_of_parameters(const graph::Graph& g) {
  std::map<int64_t, Readers> out;
  const auto& ops = g.ops();
  for (size_t i = 0; i < ops.size(); ++i) {
    const graph::Op& op = ops[i];
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      const SubTensor& in = op.inputs[k];
      if (g.tensor(in.tensor).role != graph::TensorRole::kParameter) continue;
      Readers& r = out[in.tensor.value()];
      const std::string& name = op.def->name;
      if (!r.ops.count(name)) r.names.push_back(name);
      r.ops[name].push_back(i);
      r.pieces[name].push_back({op.device, in});
      r.stages.insert(op.stage.value());
      r.linear_weight[name] = op.def->weight_product && k == 1;
    }
  }
  return out;
}

}  // namespace

Result<std::set<int64_t>> shard_parameters(const graph::Graph& g, PathFinder& paths, Lowered& out,
                                           std::vector<std::vector<int64_t>>& op_adapters) {
  std::set<int64_t> sharded;
  for (const auto& [tensor, readers] : readers_of_parameters(g)) {
    if (readers.stages.size() != 1) continue;
    const graph::FullTensor& t = g.tensor(TensorId(tensor));
    // Every reading op must read the same layout: the one the stored layout is made from.
    Result<Layout> read = layout_of(readers.pieces.at(readers.names[0]), t.shape);
    if (!read.ok() || read->v != 1 || read->r < 2) continue;
    bool same = true;
    for (const std::string& name : readers.names) {
      Result<Layout> other = layout_of(readers.pieces.at(name), t.shape);
      same = same && other.ok() && *other == *read;
    }
    if (!same) continue;
    Shape piece = t.shape;
    for (size_t k = 0; k < piece.size(); ++k) piece[k] /= read->d[k];
    const int64_t dim = shard_dim(piece, read->r);
    if (dim < 0) continue;
    const Layout stored = move_factor(*read, 0, 2 + static_cast<int>(dim), read->r);
    const int64_t elem = size_bytes(t.dtype);
    auto fail = [&](const Error& e) {
      return Error::at(
          t.name, "parameter '" + t.name + "' stored as " + stored.to_string() + ": " + e.message);
    };
    auto forward = paths.find(t.shape, elem, stored, *read);
    if (!forward.ok()) return fail(forward.error());
    auto backward = paths.find(t.shape, elem, grad_layout(*read), grad_layout(stored),
                               /*gradient=*/true);
    if (!backward.ok()) return fail(backward.error());
    const StageId stage(*readers.stages.begin());
    // One adapter per reading op: a tied embedding's gather is not held from the embedding
    // until the LM head.
    for (const std::string& name : readers.names) {
      Adapter a;
      a.id = static_cast<int64_t>(out.adapters.size());
      a.tensor = TensorId(tensor);
      a.consumer = name;
      a.consumers = {name};
      a.producer_stage = stage;
      a.consumer_stage = stage;
      a.from = stored;
      a.to = *read;
      a.forward = *forward;
      a.backward = *backward;
      a.parameter = true;
      a.regather = readers.linear_weight.at(name);
      for (size_t i : readers.ops.at(name)) op_adapters[i].push_back(a.id);
      out.adapters.push_back(std::move(a));
    }
    sharded.insert(tensor);
  }
  return sharded;
}

}  // namespace loom::lower
