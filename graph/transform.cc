#include "graph/transform.h"

#include <algorithm>

#include "core/strings.h"
#include "graph/op_registry.h"

namespace loom::graph {

Result<std::map<std::string, int64_t>> label_sizes(const Op& op) {
  std::vector<Shape> shapes;
  for (const auto& in : op.inputs) shapes.push_back(in.shape());
  auto sizes = bind_labels(op.annotation(), shapes, op.attrs());
  if (!sizes.ok()) return Error::at(op.name(), "op '" + op.name() + "': " + sizes.error().message);
  return sizes;
}

Result<std::vector<Op>> split_op(const Op& op, const std::string& label, int64_t n) {
  auto fail = [&](const std::string& why) {
    return Error::at(op.name(), "cannot split op '" + op.name() + "' (" + op.type() + ") " +
                                    std::to_string(n) + " ways: " + why);
  };
  if (n < 1) return fail("the number of parts must be positive");
  const Annotation& a = op.annotation();
  const auto& labels = a.labels();
  if (std::find(labels.begin(), labels.end(), label) == labels.end())
    return fail("its annotation '" + a.to_string() + "' has no label '" + label + "'");
  const LabelKind kind = a.kind_of(label);
  if (kind == LabelKind::kFrozen)
    return fail("label '" + label + "^' may not be split (annotation '" + a.to_string() + "')");
  const auto sites = a.sites(label);
  if (kind == LabelKind::kSplit) {
    bool in_output = false;
    for (const auto& s : sites) in_output |= s.output;
    if (!in_output)
      return fail("label '" + label + "' appears in no output; mark it '+' (reduced) or '^'");
  }
  LOOM_ASSIGN_OR_RETURN(auto sizes, label_sizes(op));
  const int64_t size = sizes.at(label);
  if (size % n != 0)
    return fail("label '" + label + "' has size " + std::to_string(size) + ", not divisible by " +
                std::to_string(n));

  std::vector<Op> out(static_cast<size_t>(n), op);
  for (int64_t i = 0; i < n; ++i) {
    Op& sub = out[static_cast<size_t>(i)];
    for (const auto& s : sites) {
      SubTensor& piece = s.output ? sub.outputs[s.tensor] : sub.inputs[s.tensor];
      Range& r = piece.ranges[s.dim];
      const int64_t step = r.size() / n;  // the label leads its group, so a part is contiguous
      r = Range{r.start + i * step, r.start + (i + 1) * step};
    }
    if (kind == LabelKind::kReduce)
      for (SubTensor& o : sub.outputs) {
        o.value_chunk = o.value_chunk * n + i;
        o.value_chunks *= n;
      }
    sub.parts.push_back(Part{static_cast<int32_t>(i), static_cast<int32_t>(n)});
  }
  return out;
}

std::vector<Op> replicate_op(const Op& op, int64_t n) {
  std::vector<Op> out(static_cast<size_t>(n), op);
  for (int64_t i = 0; i < n; ++i)
    out[static_cast<size_t>(i)].parts.push_back(
        Part{static_cast<int32_t>(i), static_cast<int32_t>(n)});
  return out;
}

namespace {

Result<size_t> index_of(const Graph& g, OpId id) {
  if (!id.valid() || id.value() >= static_cast<int64_t>(g.ops().size()))
    return Error::at("op", "graph '" + g.name() + "' has no op #" + id.to_string());
  return static_cast<size_t>(id.value());
}

// A copy of `g` whose op at `index` is replaced by `with`; ids are renumbered in order.
Graph replace(const Graph& g, size_t index, std::vector<Op> with) {
  Graph out = g;
  std::vector<Op>& ops = out.mutable_ops();
  ops.erase(ops.begin() + static_cast<std::ptrdiff_t>(index));
  ops.insert(ops.begin() + static_cast<std::ptrdiff_t>(index), with.begin(), with.end());
  for (size_t i = 0; i < ops.size(); ++i) ops[i].id = OpId(static_cast<int64_t>(i));
  return out;
}

}  // namespace

Result<Graph> partition(const Graph& g, OpId id, const std::string& label, int64_t n) {
  LOOM_ASSIGN_OR_RETURN(size_t i, index_of(g, id));
  LOOM_ASSIGN_OR_RETURN(auto parts, split_op(g.ops()[i], label, n));
  return replace(g, i, std::move(parts));
}

Result<Graph> replicate(const Graph& g, OpId id, int64_t n) {
  LOOM_ASSIGN_OR_RETURN(size_t i, index_of(g, id));
  if (n < 1)
    return Error::at(g.ops()[i].name(), "cannot replicate op '" + g.ops()[i].name() + "' " +
                                            std::to_string(n) + " times");
  return replace(g, i, replicate_op(g.ops()[i], n));
}

Result<Graph> assign(const Graph& g, OpId id, DeviceId device) {
  LOOM_ASSIGN_OR_RETURN(size_t i, index_of(g, id));
  if (!device.valid())
    return Error::at(g.ops()[i].name(),
                     "op '" + g.ops()[i].name() + "': invalid device " + device.to_string());
  Graph out = g;
  out.mutable_ops()[i].device = device;
  return out;
}

Result<Graph> stage(const Graph& g, const std::vector<OpId>& ids, StageId s) {
  if (!s.valid()) return Error::at("stage", "invalid stage " + s.to_string());
  Graph out = g;
  for (OpId id : ids) {
    LOOM_ASSIGN_OR_RETURN(size_t i, index_of(g, id));
    out.mutable_ops()[i].stage = s;
  }
  return out;
}

}  // namespace loom::graph
