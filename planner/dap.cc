#include "planner/dap.h"

namespace loom::planner {
namespace {

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

}  // namespace

Result<graph::Graph> dap_policy(const graph::Graph& g, const PlanRequest& request) {
  if (request.space.sp)
    return Error::at("parallel.sp",
                     "policy 'dap' splits the representations itself; parallel.sp must be false");
  for (const Op& op : g.ops()) {
    if (!op.attrs().has("dap"))
      return Error::at("parallel.policy", "policy 'dap' needs a `dap` axis on every op; op '" +
                                              op.name() + "' (" + op.type() + ") has none");
    if (label_at(op, op.attrs().get<int64_t>("dap")).empty())
      return Error::at("parallel.policy", "policy 'dap': op '" + op.name() + "' has no dimension " +
                                              std::to_string(op.attrs().get<int64_t>("dap")));
  }
  // Stages, the data-parallel split and placement are the hybrid engine's; inside a stage
  // each op splits along its axis.
  return hybrid_policy_with(g, request, [](const Op& op, int64_t) {
    return label_at(op, op.attrs().get<int64_t>("dap"));
  });
}

}  // namespace loom::planner
