// The hybrid policy: pipeline stages by layer, data parallelism over the batch label,
// Megatron-style tensor (and sequence) parallelism from the ops' annotations and `tp` hints.
#include <algorithm>

#include "graph/ops_context.h"
#include "graph/ops_moe.h"
#include "graph/transform.h"
#include "planner/chimera.h"
#include "planner/context_parallel.h"
#include "planner/mesh.h"
#include "planner/policy.h"
#include "planner/stages.h"

namespace loom::planner {
namespace {

using graph::Graph;
using graph::LabelKind;
using graph::Op;

// For every op, the label that carries dimension `dim` of the graph inputs (0: the batch, 1: a
// language model's sequence): inputs hold it there, and each op passes it from its inputs to the
// outputs that have the same label.
std::vector<std::string> carried_from(const Graph& g, std::vector<int64_t> carried);

std::vector<std::string> carried_labels(const Graph& g, int64_t dim) {
  std::vector<int64_t> carried(g.tensors().size(), -1);
  for (const auto& t : g.tensors())
    if (t.role == graph::TensorRole::kInput && static_cast<int64_t>(t.shape.size()) > dim)
      carried[t.id.value()] = dim;
  return carried_from(g, std::move(carried));
}

// For every op, the label that carries the expert dimension of a mixture of experts: the
// experts' buffers hold it at dimension 1 (graph/ops_moe.h) and each op passes it on as above;
// the combine, whose output has none, ends it.
std::vector<std::string> expert_labels(const Graph& g) {
  std::vector<int64_t> carried(g.tensors().size(), -1);
  for (const auto& op : g.ops())
    if (op.type() == graph::kMoeDispatch) carried[op.outputs[0].tensor.value()] = 1;
  std::vector<std::string> out = carried_from(g, std::move(carried));
  // Dispatch and combine run where their tokens are (split over the batch): the tokens travel to
  // and from the experts by all-to-all.
  for (size_t i = 0; i < out.size(); ++i)
    if (g.ops()[i].type() == graph::kMoeDispatch || g.ops()[i].type() == graph::kMoeCombine)
      out[i].clear();
  return out;
}

// The labels of carried_labels from `carried` (per tensor: the carried dimension, or -1).
std::vector<std::string> carried_from(const Graph& g, std::vector<int64_t> carried) {
  std::vector<std::string> out;
  for (const auto& op : g.ops()) {
    std::string label;
    const auto& a = op.annotation();
    for (size_t i = 0; i < op.inputs.size() && label.empty(); ++i) {
      int64_t d = carried[op.inputs[i].tensor.value()];
      if (d >= 0) label = a.inputs()[i].dims[static_cast<size_t>(d)].labels[0].name;
    }
    if (!label.empty())
      for (size_t o = 0; o < op.outputs.size(); ++o) {
        const auto& dims = a.outputs()[o].dims;
        for (size_t d = 0; d < dims.size(); ++d)
          if (dims[d].labels[0].name == label)
            carried[op.outputs[o].tensor.value()] = static_cast<int64_t>(d);
      }
    out.push_back(label);
  }
  return out;
}

// Context parallelism: `op` (one data-parallel part) as its parts over the cp ranks, each with
// the cp rank that runs it. A ring attention step runs query chunk c on rank c; other ops split
// their sequence label into cp chunks, chunk c on rank c; an op without a splittable sequence is
// replicated.
Result<std::vector<std::pair<Op, int64_t>>> cp_parts(const Op& op, const std::string& sequence,
                                                     const graph::Rewriter& rw,
                                                     const PlanRequest& request) {
  const int64_t cp = request.space.mesh.cp();
  if (cp == 1) return std::vector<std::pair<Op, int64_t>>{{op, 0}};
  const bool ring = op.type() == graph::kRingAttentionStep;
  // all-to-all (Ulysses): attention takes whole sequences of its share of the heads; the
  // lowering finds the all-to-alls between the sequence split around it and the heads split.
  std::string heads;
  if (request.space.cp_kind == CpKind::kAllToAll) heads = op.def->rules.context_heads;
  const bool splits = !sequence.empty() && op.annotation().kind_of(sequence) != LabelKind::kFrozen;
  auto parts =
      ring             ? rw.rewrite("ring attention", std::to_string(cp) + " query chunks", op,
                                    [](const Op& o) -> Result<std::vector<Op>> { return ring_step_parts(o); })
      : !heads.empty() ? rw.partition(op, heads, cp)
      : splits         ? rw.partition(op, sequence, cp)
                       : rw.replicate(op, cp);
  if (!parts.ok())
    return Error::at("parallel.cp",
                     "context parallelism " + std::to_string(cp) + ": " + parts.error().message);
  std::vector<std::pair<Op, int64_t>> out;
  for (size_t j = 0; j < parts->size(); ++j)
    out.emplace_back(std::move((*parts)[j]), static_cast<int64_t>(j));
  return out;
}

// Data and expert parallelism: `op` as its parts over the dp ranks, part d on dp rank d. An op
// on the experts' buffers (its expert label non-empty) splits the batch over the dp / ep groups
// and the experts over the ep ranks of each group (dp rank = group x ep + expert part); any
// other op splits its batch label over the dp ranks, or is replicated.
Result<std::vector<Op>> dp_ep_parts(const Op& op, const std::string& batch,
                                    const std::string& expert, const graph::Rewriter& rw,
                                    const PlanRequest& request) {
  const int64_t dp = request.space.mesh.dp(), ep = request.space.ep;
  auto split = [&](const Op& o, const std::string& label, int64_t n) {
    if (n == 1) return Result<std::vector<Op>>(std::vector<Op>{o});
    return label.empty() ? rw.replicate(o, n) : rw.partition(o, label, n);
  };
  if (expert.empty() || ep == 1) {
    auto parts = split(op, batch, dp);
    if (!parts.ok())
      return Error::at("parallel.dp",
                       "data parallelism " + std::to_string(dp) + ": " + parts.error().message);
    return parts;
  }
  auto groups = split(op, batch, dp / ep);
  if (!groups.ok())
    return Error::at("parallel.dp",
                     "data parallelism " + std::to_string(dp) + ": " + groups.error().message);
  std::vector<Op> out;
  for (const Op& group : *groups) {
    auto parts = split(group, expert, ep);
    if (!parts.ok())
      return Error::at("parallel.ep",
                       "expert parallelism " + std::to_string(ep) + ": " + parts.error().message);
    for (Op& part : *parts) out.push_back(std::move(part));
  }
  return out;
}

bool has_label(const Op& op, const std::string& label) {
  const auto& ls = op.annotation().labels();
  return std::find(ls.begin(), ls.end(), label) != ls.end();
}

}  // namespace

std::string tp_label(const Op& op, bool sp) {
  const graph::OpRules& rules = op.def->rules;
  const std::string hint = op.attrs().get_or<std::string>("tp", "");
  // The op type's own label (its registry entry: heads, vocabulary, a linear's features).
  if (rules.tensor_parallel)
    if (std::string label = rules.tensor_parallel(hint); !label.empty()) return label;
  // Any op after a column-parallel layer that keeps its feature dimension "h" splittable (gelu,
  // or a user's element-wise op) runs on the features each rank holds.
  if (hint == "column" && has_label(op, "h") && op.annotation().kind_of("h") == LabelKind::kSplit)
    return "h";
  // Outside attention and the MLP, sequence parallelism splits the sequence instead of
  // replicating (norms, residual adds, the bias after a row-parallel layer).
  if (sp && rules.sequence_parallel && has_label(op, "s") &&
      op.annotation().kind_of("s") == LabelKind::kSplit)
    return "s";
  return "";
}

Result<Graph> hybrid_policy(const Graph& g, const PlanRequest& request) {
  const bool sp = request.space.sp;
  return hybrid_policy_with(g, request, [sp](const Op& op, int64_t) { return tp_label(op, sp); });
}

Result<Graph> hybrid_policy_with(const Graph& model, const PlanRequest& request,
                                 const SplitLabel& tp_split) {
  const SpaceSpec& space = request.space;
  const DeviceMesh& mesh = space.mesh;
  const Graph& g = model;
  LOOM_ASSIGN_OR_RETURN(StagePlan stage_plan, plan_stages(g, space));
  const std::vector<std::string> batch = carried_labels(g, 0);
  const std::vector<std::string> experts =
      space.ep > 1 ? expert_labels(g) : std::vector<std::string>(g.ops().size());
  const std::vector<std::string> sequence =
      mesh.cp() > 1 ? carried_labels(g, 1) : std::vector<std::string>(g.ops().size());

  const graph::Rewriter rw = request.rewriter(g);
  Graph out = g;
  std::vector<Op>& ops = out.reset_ops();
  ops.reserve(g.ops().size() * static_cast<size_t>(mesh.size()));
  for (size_t i = 0; i < g.ops().size(); ++i) {
    const Op& op = g.ops()[i];
    const int64_t s = stage_plan.stage_of_layer(op.layer());
    const int64_t pp_rank = s % mesh.pp();  // looping placement when a device holds several stages

    LOOM_ASSIGN_OR_RETURN(std::vector<Op> dp_parts,
                          dp_ep_parts(op, batch[i], experts[i], rw, request));
    for (int64_t d = 0; d < static_cast<int64_t>(dp_parts.size()); ++d) {
      LOOM_ASSIGN_OR_RETURN(auto cp_split,
                            cp_parts(dp_parts[static_cast<size_t>(d)], sequence[i], rw, request));
      for (auto& [cp_part, cp_rank] : cp_split) {
        std::vector<Op> tp_parts{cp_part};
        if (mesh.tp() > 1) {
          const std::string label = tp_split(tp_parts[0], mesh.tp());
          auto split = label.empty() ? rw.replicate(tp_parts[0], mesh.tp())
                                     : rw.partition(tp_parts[0], label, mesh.tp());
          if (!split.ok())
            return Error::at("parallel.tp", "tensor parallelism " + std::to_string(mesh.tp()) +
                                                ": " + split.error().message);
          tp_parts = std::move(split).value();
        }
        for (int64_t t = 0; t < static_cast<int64_t>(tp_parts.size()); ++t) {
          Op& sub = tp_parts[static_cast<size_t>(t)];
          LOOM_TRY(
              rw.assign(sub, DeviceId(mesh.rank({d, pp_rank, t, cp_rank}).value()), mesh.size()));
          LOOM_TRY(rw.stage(sub, StageId(s), stage_plan.stages()));
          sub.id = OpId(static_cast<int64_t>(ops.size()));
          ops.push_back(std::move(sub));
        }
      }
    }
  }
  if (space.two_pipelines)
    return rw.apply("chimera's up pipeline", out,
                    [&mesh](const Graph& down) { return add_up_pipeline(down, mesh); });
  return out;
}

}  // namespace loom::planner
