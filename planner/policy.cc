#include "planner/policy.h"

#include "core/strings.h"
#include "planner/dap.h"

namespace loom::planner {
namespace {

// hybrid restricted to one axis: a plan that needs another axis is told to use hybrid.
Policy restricted(std::string name, std::vector<std::string> allowed) {
  return [name, allowed](const graph::Graph& g, const PlanRequest& r) -> Result<graph::Graph> {
    const DeviceMesh& mesh = r.space.mesh;
    const std::pair<const char*, int64_t> axes[] = {
        {"dp", mesh.dp()}, {"tp", mesh.tp()}, {"pp", mesh.pp()}};
    for (const auto& [axis, degree] : axes) {
      if (degree == 1 || std::find(allowed.begin(), allowed.end(), axis) != allowed.end()) continue;
      return Error::at("parallel.policy", "policy '" + name + "' does not use parallel." + axis +
                                              " (" + std::to_string(degree) +
                                              "); use policy 'hybrid'");
    }
    if (name == "sp" && !r.space.sp)
      return Error::at("parallel.policy", "policy 'sp' needs parallel.sp: true");
    return hybrid_policy(g, r);
  };
}

}  // namespace

PolicyRegistry PolicyRegistry::with_builtin_policies() {
  PolicyRegistry r;
  auto must = [&](const std::string& name, Policy p) {
    Status s = r.add(name, std::move(p));
    LOOM_CHECK(s.ok()) << s.error().message;
  };
  must("hybrid", hybrid_policy);
  must("dp", restricted("dp", {"dp"}));
  must("tp", restricted("tp", {"tp"}));
  must("sp", restricted("sp", {"tp"}));
  must("pp", restricted("pp", {"pp"}));
  must("dap", dap_policy);
  must("window", window_policy);
  return r;
}

Status PolicyRegistry::add(const std::string& name, Policy policy) {
  if (name.empty() || !policy)
    return Error::at("parallel.policy", "a policy needs a name and a function");
  if (policies_.count(name))
    return Error::at("parallel.policy", "policy '" + name + "' is already registered");
  policies_.emplace(name, std::move(policy));
  return Status::success();
}

const Policy* PolicyRegistry::find(const std::string& name) const {
  auto it = policies_.find(name);
  return it == policies_.end() ? nullptr : &it->second;
}

std::vector<std::string> PolicyRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : policies_) out.push_back(k);
  return out;
}

graph::Rewriter PlanRequest::rewriter(const graph::Graph& graph) const {
  return graph::Rewriter(graph, space.policy + " policy", verify);
}

Result<graph::Graph> plan_graph(const graph::Graph& graph, const PlanRequest& request,
                                const PolicyRegistry& policies) {
  const SpaceSpec& space = request.space;
  if (space.mesh.size() != request.world_size)
    return Error::at("parallel.dp", space.degrees() + " = " + std::to_string(space.mesh.size()) +
                                        ", but the world size is " +
                                        std::to_string(request.world_size));
  const Policy* policy = policies.find(space.policy);
  if (!policy) {
    std::string msg = "unknown policy '" + space.policy + "'";
    std::string close = closest_match(space.policy, policies.names());
    if (!close.empty()) msg += " (did you mean '" + close + "'?)";
    return Error::at("parallel.policy", msg + "; policies: " + join(policies.names(), ", "));
  }
  return (*policy)(graph, request);
}

}  // namespace loom::planner
