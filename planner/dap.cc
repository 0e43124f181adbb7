#include "planner/dap.h"

#include "graph/transform.h"
#include "planner/mesh.h"
#include "planner/stages.h"

namespace loom::planner {
namespace {

using graph::Graph;
using graph::Op;

// The label of dimension `dim` of the op's first output, or of its first input when the
// output is a scalar (a loss); "" when there is none.
std::string label_at(const Op& op, int64_t dim) {
  const auto& a = op.annotation();
  const graph::TensorSpec* spec = nullptr;
  if (!a.outputs().empty() && !a.outputs()[0].dims.empty())
    spec = &a.outputs()[0];
  else if (!a.inputs().empty())
    spec = &a.inputs()[0];
  if (!spec || dim < 0 || dim >= static_cast<int64_t>(spec->dims.size())) return "";
  return spec->dims[static_cast<size_t>(dim)].labels[0].name;
}

Result<std::vector<Op>> split(const Config& c, const char* key, const Op& op,
                              const std::string& label, int64_t n) {
  auto parts = graph::split_op(op, label, n);
  if (!parts.ok()) return c.error(key, "policy 'dap': " + parts.error().message);
  return parts;
}

}  // namespace

Result<Graph> dap_policy(const Graph& g, const PlanRequest& request) {
  const Config& c = request.config;
  const auto& p = c.parallel;
  if (p.sp)
    return c.error("parallel.sp",
                   "policy 'dap' splits the representations itself; "
                   "parallel.sp must be false");
  LOOM_ASSIGN_OR_RETURN(DeviceMesh mesh, DeviceMesh::make(p.dp, p.pp, p.tp));
  LOOM_ASSIGN_OR_RETURN(StagePlan stage_plan, plan_stages(g, p.pp * p.chunks, c));

  Graph out = g;
  std::vector<Op>& ops = out.mutable_ops();
  ops.clear();
  ops.reserve(g.ops().size() * static_cast<size_t>(mesh.size()));
  for (const Op& op : g.ops()) {
    if (!op.attrs().has("dap"))
      return c.error("parallel.policy", "policy 'dap' needs a `dap` axis on every op; op '" +
                                            op.name() + "' (" + op.type() + ") has none");
    const std::string axis = label_at(op, op.attrs().get<int64_t>("dap"));
    const std::string batch = label_at(op, 0);
    if (axis.empty() || batch.empty())
      return c.error("parallel.policy", "policy 'dap': op '" + op.name() + "' has no dimension " +
                                            std::to_string(op.attrs().get<int64_t>("dap")));
    const int64_t s = stage_plan.stage_of_layer(op.layer());
    const int64_t pp_rank = s % p.pp;

    std::vector<Op> dp_parts{op};
    if (p.dp > 1) {
      LOOM_ASSIGN_OR_RETURN(dp_parts, split(c, "parallel.dp", op, batch, p.dp));
    }
    for (int64_t d = 0; d < p.dp; ++d) {
      std::vector<Op> dap_parts{dp_parts[static_cast<size_t>(d)]};
      if (p.tp > 1) {
        LOOM_ASSIGN_OR_RETURN(dap_parts, split(c, "parallel.tp", dap_parts[0], axis, p.tp));
      }
      for (int64_t t = 0; t < p.tp; ++t) {
        Op& sub = dap_parts[static_cast<size_t>(t)];
        sub.device = DeviceId(mesh.rank({d, pp_rank, t}).value());
        sub.stage = StageId(s);
        sub.id = OpId(static_cast<int64_t>(ops.size()));
        ops.push_back(std::move(sub));
      }
    }
  }
  return out;
}

}  // namespace loom::planner
