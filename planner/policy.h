// Parallel policies: functions from the single-device graph and the plan's split to a transformed,
// placed, staged graph. Registered by name; user code registers its own. A policy applies every
// transform through request.rewriter(), so each is checked as it runs (request.verify).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/result.h"
#include "core/run_spec.h"
#include "graph/graph.h"
#include "graph/rewriter.h"
#include "planner/space_spec.h"

namespace loom::planner {

// What a policy plans for. Errors name the config key they concern (Error::at); the plan adds
// where it came from.
struct PlanRequest {
  const SpaceSpec& space;  // parallel.*, read once
  int64_t world_size;      // the ranks the plan is for
  // What each parameter element costs in training state (the window policy's weighing).
  OptimizerKind optimizer = OptimizerKind::kAdamw;
  // Whether each transform a policy applies is checked as it runs (graph/rewriter.h): on in
  // debug builds and tests, off in release builds unless LOOM_VERIFY_EACH_TRANSFORM=1.
  graph::VerifyMode verify = graph::default_verify_mode();

  // What a policy applies its transforms to `graph` with; errors name the policy
  // ("tp policy: partition(op ...)").
  graph::Rewriter rewriter(const graph::Graph& graph) const;
};

using Policy = std::function<Result<graph::Graph>(const graph::Graph&, const PlanRequest&)>;

class PolicyRegistry {
 public:
  // hybrid (any dp x tp x pp, with sp and chunks), and dp, tp, sp, pp: hybrid restricted to
  // their own axis.
  static PolicyRegistry with_builtin_policies();
  Status add(const std::string& name, Policy policy);
  const Policy* find(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  std::map<std::string, Policy> policies_;
};

// Checks the world size against the mesh and runs the policy request.space names. Errors name
// the config keys and the numbers involved.
Result<graph::Graph> plan_graph(const graph::Graph& graph, const PlanRequest& request,
                                const PolicyRegistry& policies);

// The hybrid engine itself: stages by layer (balanced by FLOPs, or parallel.stages), the batch
// split over dp, Megatron-style tensor parallelism (with sequence parallelism when space.sp)
// over tp, each sub-operator placed on the mesh dp x pp x tp; with space.two_pipelines,
// chimera's second pipeline (planner/chimera.h).
Result<graph::Graph> hybrid_policy(const graph::Graph& graph, const PlanRequest& request);

// The label along which an op (after the data-parallel split) splits over the parallel.tp
// ranks of its stage; "" replicates it.
using SplitLabel = std::function<std::string(const graph::Op& op, int64_t degree)>;
// The hybrid engine with another split inside a stage (the window-parallel policy uses it).
Result<graph::Graph> hybrid_policy_with(const graph::Graph& graph, const PlanRequest& request,
                                        const SplitLabel& tp_split);
// Megatron's split of a transformer op over tensor-parallel ranks: its type's label
// (graph::OpRules: heads, MLP columns and rows, vocabulary), the features after a
// column-parallel layer, the sequence of a sequence-parallel op when `sp`; "" replicates it.
std::string tp_label(const graph::Op& op, bool sp);

// Window parallelism for vision models, degree parallel.tp, with dp and pp as in hybrid: each op
// splits along its `wp` hint (image rows, windows, or channels where shifted windows mix rows);
// where that label does not divide, along its tensor-parallel label; else it is replicated.
Result<graph::Graph> window_policy(const graph::Graph& graph, const PlanRequest& request);

}  // namespace loom::planner
