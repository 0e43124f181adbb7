#include "graph/precision.h"

#include <vector>

namespace loom::graph {
Graph with_compute_dtype(Graph graph, DType compute, const OpRegistry& ops) {
  if (compute == DType::kFloat32) return graph;
  std::vector<bool> keep(graph.tensors().size(), false);
  for (const Op& op : graph.ops()) {
    const OpSchema* schema = ops.find(op.type());
    if (!schema || !schema->fp32_outputs) continue;
    for (const SubTensor& out : op.outputs) keep[static_cast<size_t>(out.tensor.value())] = true;
  }
  std::vector<TensorId> lowered;  // found first: the first change may copy the tensors
  for (const FullTensor& t : graph.tensors()) {
    const bool activation = t.role == TensorRole::kActivation || t.role == TensorRole::kInput;
    if (activation && is_floating(t.dtype) && !keep[static_cast<size_t>(t.id.value())])
      lowered.push_back(t.id);
  }
  for (TensorId id : lowered) graph.mutable_tensor(id).dtype = compute;
  return graph;
}

bool fused_attention(bool bf16, bool on_gpu) { return on_gpu || !bf16; }

}  // namespace loom::graph
