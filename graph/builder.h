// The API models are written in. The builder infers shapes from the op registry and keeps the
// first error it meets (later calls become no-ops), so a model reads as straight-line code and
// reports one clear failure from finish().
#pragma once

#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/op_registry.h"

namespace loom::graph {

class GraphBuilder {
 public:
  GraphBuilder(const OpRegistry& registry, std::string name);

  // `value_bound`: integer inputs hold values in [0, value_bound) (see FullTensor).
  TensorId input(const std::string& name, const Shape& shape, DType dtype, int64_t value_bound = 0);
  TensorId parameter(const std::string& name, const Shape& shape, ParamInit init,
                     DType dtype = DType::kFloat32);
  // Adds an op; its outputs are named "<name>" (one output) or "<name>.<i>".
  std::vector<TensorId> op(const std::string& type, const std::string& name,
                           const std::vector<TensorId>& inputs, Attrs attrs = {});
  TensorId op1(const std::string& type, const std::string& name,
               const std::vector<TensorId>& inputs, Attrs attrs = {});

  // Ops added from now on belong to this model layer (see kPreLayers / kPostLayers).
  void set_layer(int64_t layer) { layer_ = layer; }
  void set_loss(TensorId loss);
  const FullTensor& tensor(TensorId id) const { return graph_.tensor(id); }
  bool ok() const { return error_.message.empty(); }

  Result<Graph> finish();

 private:
  TensorId add(FullTensor t);
  void fail(Error e);

  const OpRegistry& registry_;
  Graph graph_;
  int64_t layer_ = kPreLayers;
  Error error_;
};

}  // namespace loom::graph
