#include "lower/backward_comm.h"

namespace loom::lower {
namespace {

// The first step of `path` in which a device waits for another: a collective over a group of
// two or more, or a transfer.
const CommStep* first_exchange(const CommPath& path) {
  for (const CommStep& step : path.steps) {
    if (rule_of(step.primitive).kind == PrimitiveKind::kLocal) continue;
    for (const auto& group : step.groups)
      if (group.size() > 1) return &step;
  }
  return nullptr;
}

std::string describe(const graph::Graph& graph, const Adapter& a, const CommStep& step,
                     const std::string& where) {
  return "the " + to_string(step.primitive) + " of tensor '" + graph.tensor(a.tensor).name +
         "' read by '" + a.consumer + "' " + where;
}

}  // namespace

std::optional<std::string> exchange_in_backward(const graph::Graph& graph, const Lowered& lowered) {
  for (const Program& program : lowered.programs)
    for (const Segment& segment : program.segments)
      for (const SegmentItem& item : segment.items) {
        if (item.kind != SegmentItem::Kind::kAdapter) continue;
        const Adapter& a = lowered.adapters[static_cast<size_t>(item.index)];
        if (!a.parameter && (a.cross_stage() || a.disjoint)) continue;
        // The gradient path is the forward path's dual: where the forward moves data between
        // devices, so does it. Recomputation and regathers repeat only such adapters, so the
        // gradient path alone decides.
        if (const CommStep* s = first_exchange(a.backward))
          return describe(
              graph, a, *s,
              a.parameter ? "(parallel.zero 3) in its gradient path" : "in its gradient path");
      }
  return std::nullopt;
}

}  // namespace loom::lower
