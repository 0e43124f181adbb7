#include "graph/verify.h"

#include <vector>

namespace loom::graph {

Status verify(const Graph& g, const OpRegistry& registry) {
  std::vector<bool> written(g.tensors().size(), false);
  for (const auto& t : g.tensors())
    if (t.role == TensorRole::kInput || t.role == TensorRole::kParameter ||
        t.role == TensorRole::kBuffer)
      written[t.id.value()] = true;

  for (const auto& op : g.ops()) {
    auto where = [&](const std::string& why) {
      return Error::at(op.name(), "op '" + op.name() + "' (" + op.type() + "): " + why);
    };
    if (!registry.find(op.type())) return where("unknown op type");
    if (op.inputs.size() != op.annotation().inputs().size() ||
        op.outputs.size() != op.annotation().outputs().size())
      return where("has " + std::to_string(op.inputs.size()) + " inputs and " +
                   std::to_string(op.outputs.size()) + " outputs but its annotation is '" +
                   op.annotation().to_string() + "'");
    std::vector<Shape> in_shapes;
    for (const auto& s : op.inputs) {
      const FullTensor& t = g.tensor(s.tensor);
      if (!written[s.tensor.value()])
        return where("reads '" + t.name + "' before any op writes it");
      if (s.ranges.size() != t.shape.size())
        return where("piece of '" + t.name + "' has " + std::to_string(s.ranges.size()) +
                     " ranges for a " + std::to_string(t.shape.size()) + "-d tensor");
      for (size_t d = 0; d < s.ranges.size(); ++d)
        if (s.ranges[d].start < 0 || s.ranges[d].end > t.shape[d] ||
            s.ranges[d].start >= s.ranges[d].end)
          return where("piece " + s.ranges_string() + " is outside '" + t.name + "' " +
                       to_string(t.shape));
      in_shapes.push_back(s.shape());
    }
    auto out_shapes = shapes_from_annotation(op.annotation(), in_shapes, op.attrs());
    if (!out_shapes.ok()) return where(out_shapes.error().message);
    for (size_t i = 0; i < op.outputs.size(); ++i) {
      const SubTensor& s = op.outputs[i];
      if (s.shape() != (*out_shapes)[i])
        return where("output '" + g.tensor(s.tensor).name + "' piece " + s.ranges_string() +
                     " does not have the shape " + to_string((*out_shapes)[i]) +
                     " its inputs imply");
      written[s.tensor.value()] = true;
    }
  }
  if (!g.loss().valid()) return Error::at(g.name(), "graph '" + g.name() + "' has no loss");
  if (!written[g.loss().value()])
    return Error::at(g.name(), "no op writes the loss '" + g.tensor(g.loss()).name + "'");
  return Status::success();
}

}  // namespace loom::graph
