#include "planner/stages.h"

#include <algorithm>
#include <limits>

#include "planner/cost.h"

namespace loom::planner {

int64_t StagePlan::stage_of_layer(int64_t layer) const {
  if (layer < first_layer.front()) return 0;
  for (int64_t k = 0; k < stages(); ++k)
    if (layer <= last_layer[k]) return k;
  return stages() - 1;
}

namespace {

// Forward FLOPs per model layer, and of the ops before the first layer and after the last.
struct LayerCosts {
  std::vector<double> layer;  // at least one entry
  double pre = 0, post = 0;
  int64_t layers = 0;  // the model's layers (0: none)
};

LayerCosts layer_costs(const graph::Graph& graph) {
  LayerCosts c;
  for (const auto& op : graph.ops())
    if (op.layer() >= 0 && op.layer() < graph::kPostLayers)
      c.layers = std::max(c.layers, op.layer() + 1);
  c.layer.assign(static_cast<size_t>(std::max<int64_t>(c.layers, 1)), 0.0);
  FlopsMemo flops;
  for (const auto& op : graph.ops()) {
    const double f = flops(op);
    if (op.layer() == graph::kPreLayers)
      c.pre += f;
    else if (op.layer() == graph::kPostLayers)
      c.post += f;
    else
      c.layer[static_cast<size_t>(op.layer())] += f;
  }
  return c;
}

// parallel.stages as given: `stages` entries covering every layer once, in order.
Status given_stages(const std::vector<StageRange>& given, int64_t stages, int64_t layers,
                    const std::string& what, StagePlan& plan) {
  if (static_cast<int64_t>(given.size()) != stages)
    return Error::at("parallel.stages",
                     "lists " + std::to_string(given.size()) + " stages but " + what);
  int64_t next = 0;
  for (size_t k = 0; k < given.size(); ++k) {
    const int64_t a = given[k].first_layer, b = given[k].last_layer;
    const std::string entry =
        "entry " + std::to_string(k) + " [" + std::to_string(a) + ", " + std::to_string(b) + "]";
    if (a > b) return Error::at("parallel.stages", entry + " ends before it starts");
    if (a < next)
      return Error::at("parallel.stages", entry + " repeats layer " + std::to_string(a));
    if (a > next)
      return Error::at("parallel.stages", entry + " skips layer " + std::to_string(next));
    if (b >= layers)
      return Error::at("parallel.stages",
                       entry + " goes past the last layer (" + std::to_string(layers - 1) + ")");
    plan.first_layer.push_back(a);
    plan.last_layer.push_back(b);
    next = b + 1;
  }
  if (next != layers)
    return Error::at("parallel.stages", "layers " + std::to_string(next) + ".." +
                                            std::to_string(layers - 1) + " are in no stage");
  return Status::success();
}

// The contiguous split of the layers into `stages` that minimises the most expensive stage
// (dynamic programming over layers).
void balanced_stages(const LayerCosts& c, int64_t stages, StagePlan& plan) {
  const int64_t L = std::max<int64_t>(c.layers, 1);
  std::vector<double> prefix(static_cast<size_t>(L + 1), 0.0);
  for (int64_t l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + c.layer[static_cast<size_t>(l)];
  auto span = [&](int64_t a, int64_t b, int64_t k) {  // layers [a, b) as stage k
    return prefix[b] - prefix[a] + (k == 0 ? c.pre : 0) + (k == stages - 1 ? c.post : 0);
  };
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][l]: the least max-cost of putting layers [0, l) into stages 0..k-1.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int64_t>> cut(stages + 1, std::vector<int64_t>(L + 1, 0));
  best[0][0] = 0;
  for (int64_t k = 1; k <= stages; ++k)
    for (int64_t l = k; l <= L; ++l)
      for (int64_t a = k - 1; a < l; ++a) {
        const double cost = std::max(best[k - 1][a], span(a, l, k - 1));
        if (cost < best[k][l]) {
          best[k][l] = cost;
          cut[k][l] = a;
        }
      }
  std::vector<int64_t> bounds(static_cast<size_t>(stages + 1));
  bounds[stages] = L;
  for (int64_t k = stages; k >= 1; --k) bounds[k - 1] = cut[k][bounds[k]];
  for (int64_t k = 0; k < stages; ++k) {
    plan.first_layer.push_back(bounds[k]);
    plan.last_layer.push_back(bounds[k + 1] - 1);
  }
}

}  // namespace

Result<StagePlan> plan_stages(const graph::Graph& graph, const SpaceSpec& space) {
  const int64_t stages = space.pipeline_stages();
  const LayerCosts c = layer_costs(graph);
  const std::string what = "parallel.pp (" + std::to_string(space.mesh.pp()) +
                           ") x parallel.chunks (" + std::to_string(space.chunks) +
                           ") = " + std::to_string(stages) + " stages";
  if (stages > std::max<int64_t>(c.layers, 1))
    return Error::at("parallel.pp",
                     what + ", but the model has only " + std::to_string(c.layers) + " layers");
  StagePlan plan;
  if (!space.stages.empty())
    LOOM_TRY(given_stages(space.stages, stages, c.layers, what, plan));
  else
    balanced_stages(c, stages, plan);
  for (int64_t k = 0; k < stages; ++k) {
    double f = (k == 0 ? c.pre : 0) + (k == stages - 1 ? c.post : 0);
    for (int64_t l = plan.first_layer[k]; l <= plan.last_layer[k] && l < c.layers; ++l)
      f += c.layer[static_cast<size_t>(l)];
    plan.flops.push_back(f);
  }
  return plan;
}

}  // namespace loom::planner
