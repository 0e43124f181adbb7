#include "planner/cost.h"

#include <algorithm>

#include "graph/transform.h"

namespace loom::planner {

double op_flops(const graph::Op& op) {
  auto sizes = graph::label_sizes(op);
  if (!sizes.ok()) return 0;
  if (const graph::FlopsRule& rule = op.def->rules.flops)
    return rule(graph::FlopsInput{*sizes, op.attrs(), &op});
  // Otherwise: a few operations per element of the largest operand.
  double largest = 0;
  for (const auto& io : {&op.inputs, &op.outputs})
    for (const auto& s : *io) largest = std::max(largest, static_cast<double>(numel(s.shape())));
  return 4.0 * largest;
}

double FlopsMemo::operator()(const graph::Op& op) {
  key_.first = op.def.get();
  std::vector<int64_t>& shapes = key_.second;
  shapes.clear();
  for (const auto* io : {&op.inputs, &op.outputs})
    for (const auto& piece : *io) {
      shapes.push_back(static_cast<int64_t>(piece.ranges.size()));
      for (const auto& r : piece.ranges) shapes.push_back(r.size());
    }
  if (op.def->rules.flops_by_position)
    for (const auto& piece : op.inputs)
      for (const auto& r : piece.ranges) shapes.push_back(r.start);
  auto& seen = counted_[key_];
  for (const auto& [attrs, flops] : seen)
    if (attrs == op.attrs()) return flops;
  const double flops = op_flops(op);
  seen.emplace_back(op.attrs(), flops);
  return flops;
}

std::vector<double> graph_flops(const graph::Graph& g, FlopsMemo* memo) {
  FlopsMemo own;
  FlopsMemo& counted = memo ? *memo : own;
  std::vector<double> out;
  out.reserve(g.ops().size());
  for (const graph::Op& op : g.ops()) out.push_back(counted(op));
  return out;
}

int64_t piece_elements(const graph::SubTensor& piece) {
  int64_t n = 1;
  for (const graph::Range& r : piece.ranges) n *= r.size();
  return n;
}

double op_output_bytes(const graph::Graph& graph, const graph::Op& op) {
  double bytes = 0;
  for (const auto& o : op.outputs)
    bytes += static_cast<double>(piece_elements(o) * size_bytes(graph.tensor(o.tensor).dtype));
  return bytes;
}

}  // namespace loom::planner
