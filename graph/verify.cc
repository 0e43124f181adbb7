#include "graph/verify.h"

#include <algorithm>
#include <numeric>
#include <vector>

namespace loom::graph {

// On every cell of the grid the pieces' ranges cut, either the value chunks present add up to
// the whole value, or `want`'s own chunk is present. Chunk c of m is the interval
// [c/m, (c+1)/m) of the value.
bool coverable(const SubTensor& want, const std::vector<const SubTensor*>& have) {
  // Most reads are of a piece one op wrote whole (or of part of it): found without cutting the
  // ranges into cells, which costs a plan of thousands of ranks most of its verification.
  const size_t dims = want.ranges.size();
  for (const SubTensor* h : have) {
    if (h->value_chunks != 1 &&
        (h->value_chunks != want.value_chunks || h->value_chunk != want.value_chunk))
      continue;
    bool inside = true;
    for (size_t d = 0; d < dims && inside; ++d)
      inside = h->ranges[d].start <= want.ranges[d].start && h->ranges[d].end >= want.ranges[d].end;
    if (inside) return true;
  }
  int64_t denom = want.value_chunks;
  for (const SubTensor* h : have) denom = std::lcm(denom, h->value_chunks);
  std::vector<std::vector<int64_t>> cuts(dims);
  for (size_t d = 0; d < dims; ++d) {
    const Range& w = want.ranges[d];
    cuts[d] = {w.start, w.end};
    for (const SubTensor* h : have)
      for (int64_t x : {h->ranges[d].start, h->ranges[d].end})
        if (x > w.start && x < w.end) cuts[d].push_back(x);
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
  }
  std::vector<size_t> cell(dims, 0);
  while (true) {
    // Value intervals (in units of 1/denom) held on this cell.
    std::vector<std::pair<int64_t, int64_t>> held;
    for (const SubTensor* h : have) {
      bool inside = true;
      for (size_t d = 0; d < dims && inside; ++d)
        inside = h->ranges[d].start <= cuts[d][cell[d]] && h->ranges[d].end >= cuts[d][cell[d] + 1];
      if (!inside) continue;
      const int64_t unit = denom / h->value_chunks;
      held.push_back({h->value_chunk * unit, (h->value_chunk + 1) * unit});
    }
    std::sort(held.begin(), held.end());
    auto covers = [&](int64_t lo, int64_t hi) {
      int64_t reach = lo;
      for (const auto& [a, b] : held)
        if (a <= reach) reach = std::max(reach, b);
      return reach >= hi;
    };
    const int64_t unit = denom / want.value_chunks;
    if (!covers(0, denom) && !covers(want.value_chunk * unit, (want.value_chunk + 1) * unit))
      return false;
    size_t d = 0;
    for (; d < dims; ++d) {
      if (++cell[d] + 1 < cuts[d].size()) break;
      cell[d] = 0;
    }
    if (d == dims) return true;
  }
}

namespace {

Error op_error(const Op& op, const std::string& why) {
  return Error::at(op.name(), "op '" + op.name() + "' (" + op.type() + "): " + why);
}

// The whole-graph checks; `registry`, when given, must know every op type.
Status verify_graph(const Graph& g, const OpRegistry* registry) {
  std::vector<bool> written(g.tensors().size(), false);
  std::vector<std::vector<const SubTensor*>> pieces(g.tensors().size());
  for (const auto& t : g.tensors())
    if (t.role == TensorRole::kInput || t.role == TensorRole::kParameter ||
        t.role == TensorRole::kBuffer)
      written[t.id.value()] = true;

  for (const auto& op : g.ops()) {
    if (registry && !registry->find(op.type())) return op_error(op, "unknown op type");
    for (const auto& s : op.inputs)
      if (!written[s.tensor.value()])
        return op_error(op, "reads '" + g.tensor(s.tensor).name + "' before any op writes it");
    LOOM_TRY(verify_op(g, op));
    for (const auto& s : op.outputs) {
      written[s.tensor.value()] = true;
      pieces[s.tensor.value()].push_back(&s);
    }
  }
  // Every piece an op reads of an activation must be makeable from the pieces ops write.
  for (const auto& op : g.ops())
    for (const auto& s : op.inputs) {
      const FullTensor& t = g.tensor(s.tensor);
      if (t.role != TensorRole::kActivation && t.role != TensorRole::kLoss) continue;
      if (!coverable(s, pieces[s.tensor.value()]))
        return op_error(
            op, "no ops write enough of '" + t.name + "' to make its piece " + s.ranges_string());
    }
  if (!g.loss().valid()) return Error::at(g.name(), "graph '" + g.name() + "' has no loss");
  if (!written[g.loss().value()])
    return Error::at(g.name(), "no op writes the loss '" + g.tensor(g.loss()).name + "'");
  return Status::success();
}

}  // namespace

Status verify_op(const Graph& g, const Op& op) {
  if (op.inputs.size() != op.annotation().inputs().size() ||
      op.outputs.size() != op.annotation().outputs().size())
    return op_error(op, "has " + std::to_string(op.inputs.size()) + " inputs and " +
                            std::to_string(op.outputs.size()) + " outputs but its annotation is '" +
                            op.annotation().to_string() + "'");
  std::vector<Shape> in_shapes;
  in_shapes.reserve(op.inputs.size());
  for (const auto& s : op.inputs) {
    const FullTensor& t = g.tensor(s.tensor);
    if (s.ranges.size() != t.shape.size())
      return op_error(op, "piece of '" + t.name + "' has " + std::to_string(s.ranges.size()) +
                              " ranges for a " + std::to_string(t.shape.size()) + "-d tensor");
    for (size_t d = 0; d < s.ranges.size(); ++d)
      if (s.ranges[d].start < 0 || s.ranges[d].end > t.shape[d] ||
          s.ranges[d].start >= s.ranges[d].end)
        return op_error(op, "piece " + s.ranges_string() + " is outside '" + t.name + "' " +
                                to_string(t.shape));
    in_shapes.push_back(s.shape());
  }
  auto out_shapes = shapes_from_annotation(op.annotation(), in_shapes, op.attrs());
  if (!out_shapes.ok()) return op_error(op, out_shapes.error().message);
  for (size_t i = 0; i < op.outputs.size(); ++i) {
    const SubTensor& s = op.outputs[i];
    if (s.shape() != (*out_shapes)[i])
      return op_error(op, "output '" + g.tensor(s.tensor).name + "' piece " + s.ranges_string() +
                              " does not have the shape " + to_string((*out_shapes)[i]) +
                              " its inputs imply");
  }
  return Status::success();
}

Status verify(const Graph& g, const OpRegistry& registry) { return verify_graph(g, &registry); }

Status verify(const Graph& g) { return verify_graph(g, nullptr); }

}  // namespace loom::graph
