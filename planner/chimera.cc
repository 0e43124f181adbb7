#include "planner/chimera.h"

#include <memory>
#include <string>

namespace loom::planner {

Result<graph::Graph> add_up_pipeline(const graph::Graph& down, const DeviceMesh& mesh) {
  graph::Graph out = down;
  const int64_t p = mesh.pp();
  // Activations and the loss get a second tensor; inputs, parameters and buffers are shared
  // (every replica reads the same inputs and updates the same weights).
  std::vector<TensorId> up_of(down.tensors().size());
  for (const auto& t : down.tensors()) {
    up_of[t.id.value()] = t.id;
    if (t.role != graph::TensorRole::kActivation && t.role != graph::TensorRole::kLoss) continue;
    graph::FullTensor copy = t;
    copy.name += kUpPipelineSuffix;
    up_of[t.id.value()] = out.add_tensor(std::move(copy));
  }
  std::vector<graph::Op>& ops = out.mutable_ops();
  const size_t n = ops.size();
  ops.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    graph::Op op = ops[i];
    DeviceMesh::Coord c = mesh.coord(Rank(op.device.value()));
    if (op.stage.value() != c.pp)
      return Error::at(op.name(), "chimera: op '" + op.name() + "' of stage " +
                                      op.stage.to_string() + " is on pipeline rank " +
                                      std::to_string(c.pp) +
                                      "; chimera needs stage s on pipeline rank s");
    auto def = std::make_shared<graph::OpDef>(*op.def);
    def->name += kUpPipelineSuffix;
    op.def = std::move(def);
    for (auto& in : op.inputs) in.tensor = up_of[in.tensor.value()];
    for (auto& o : op.outputs) o.tensor = up_of[o.tensor.value()];
    c.pp = p - 1 - c.pp;
    op.device = DeviceId(mesh.rank(c).value());
    op.stage = StageId(p + op.stage.value());
    op.id = OpId(static_cast<int64_t>(ops.size()));
    ops.push_back(std::move(op));
  }
  return out;
}

}  // namespace loom::planner
