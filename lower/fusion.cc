#include "lower/fusion.h"

#include <unordered_map>
#include <unordered_set>

namespace loom::lower {

std::vector<bool> fused_into_next(const graph::Graph& planned, const Lowered& lowered) {
  const auto& ops = planned.ops();
  const int64_t tensors = static_cast<int64_t>(planned.tensors().size());
  std::vector<bool> fused(ops.size(), false);
  std::unordered_set<int64_t> adapted;  // tensors some adapter moves or changes
  for (const Adapter& a : lowered.adapters) adapted.insert(a.tensor.value());
  // Readers of each linear's output on each rank, keyed rank * tensors + tensor (only a linear's
  // output can be fused away: the other tensors' readers are not counted).
  std::vector<bool> linear_output(static_cast<size_t>(tensors), false);
  for (const graph::Op& op : ops)
    if (op.outputs.size() == 1 && op.type() == "linear")
      linear_output[static_cast<size_t>(op.outputs[0].tensor.value())] = true;
  std::unordered_map<int64_t, int> readers;
  for (const graph::Op& op : ops)
    for (const auto& in : op.inputs)
      if (linear_output[static_cast<size_t>(in.tensor.value())])
        ++readers[op.device.value() * tensors + in.tensor.value()];
  for (const Program& prog : lowered.programs)
    for (const Segment& seg : prog.segments)
      for (size_t i = 0; i + 1 < seg.items.size(); ++i) {
        const SegmentItem& a = seg.items[i];
        const SegmentItem& b = seg.items[i + 1];
        if (a.kind != SegmentItem::Kind::kOp || b.kind != SegmentItem::Kind::kOp) continue;
        const graph::Op& lin = ops[static_cast<size_t>(a.index)];
        const graph::Op& bias = ops[static_cast<size_t>(b.index)];
        if (lin.type() != "linear" || bias.type() != "bias_add" || lin.inputs.size() != 2 ||
            lin.outputs.size() != 1 || bias.device != lin.device)
          continue;
        const graph::SubTensor& out = lin.outputs[0];
        if (bias.inputs[0] == out && !out.is_partial() && out.tensor != planned.loss() &&
            readers[lin.device.value() * tensors + out.tensor.value()] == 1 &&
            !adapted.count(out.tensor.value())) {
          fused[static_cast<size_t>(a.index)] = true;
          ++i;  // the bias_add is taken
        }
      }
  return fused;
}

}  // namespace loom::lower
