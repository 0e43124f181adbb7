// Window parallelism: attention inside a window is independent of other windows, so the windows
// dimension (and, between attentions, the image rows) splits without replicating activations.
// It replicates the weights instead, which pays where activations outweigh weights: the early,
// high-resolution stages. Blocks whose weights outweigh their activations (late stages: few
// tokens, wide features) take the Megatron split.
#include <map>

#include "core/training_state.h"
#include "graph/transform.h"
#include "planner/cost.h"
#include "planner/policy.h"

namespace loom::planner {
namespace {

// Per model layer: true when the activations a replica's ops write outweigh what a weight
// costs per rank (the weight, its gradient and the optimizer's state), so splitting
// activations and replicating weights holds less per rank.
std::map<int64_t, bool> activation_heavy(const graph::Graph& g, const PlanRequest& request) {
  const double per_element = training_state_bytes(request.optimizer).total();
  const double dp = static_cast<double>(request.space.mesh.dp());
  std::map<int64_t, double> acts, weights;
  for (const auto& op : g.ops()) {
    acts[op.layer()] += op_output_bytes(g, op) / dp;
    for (const auto& in : op.inputs) {
      const auto& t = g.tensor(in.tensor);
      if (t.role == graph::TensorRole::kParameter)
        weights[op.layer()] += per_element * static_cast<double>(numel(t.shape));
    }
  }
  std::map<int64_t, bool> out;
  for (const auto& [layer, a] : acts) out[layer] = a >= weights[layer];
  return out;
}

}  // namespace

Result<graph::Graph> window_policy(const graph::Graph& g, const PlanRequest& request) {
  const auto heavy = activation_heavy(g, request);
  return hybrid_policy_with(
      g, request,
      [&heavy, sp = request.space.sp](const graph::Op& op, int64_t degree) -> std::string {
        const std::string wp = op.attrs().get_or<std::string>("wp", "");
        if (!wp.empty() && heavy.at(op.layer()) && graph::split_op(op, wp, degree).ok()) return wp;
        const std::string tp = tp_label(op, sp);
        if (!tp.empty() && graph::split_op(op, tp, degree).ok()) return tp;
        return "";
      });
}

}  // namespace loom::planner
