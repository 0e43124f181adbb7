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

Result<StagePlan> plan_stages(const graph::Graph& graph, const SpaceSpec& space,
                              const Config& config) {
  const int64_t stages = space.pipeline_stages();
  int64_t layers = 0;
  for (const auto& op : graph.ops())
    if (op.layer() >= 0 && op.layer() < graph::kPostLayers)
      layers = std::max(layers, op.layer() + 1);
  std::vector<double> cost(static_cast<size_t>(std::max<int64_t>(layers, 1)), 0.0);
  double pre = 0, post = 0;
  FlopsMemo flops;
  for (const auto& op : graph.ops()) {
    double f = flops(op);
    if (op.layer() == graph::kPreLayers)
      pre += f;
    else if (op.layer() == graph::kPostLayers)
      post += f;
    else
      cost[static_cast<size_t>(op.layer())] += f;
  }
  StagePlan plan;
  const std::string what = "parallel.pp (" + std::to_string(space.mesh.pp()) +
                           ") x parallel.chunks (" + std::to_string(space.chunks) +
                           ") = " + std::to_string(stages) + " stages";
  if (stages > std::max<int64_t>(layers, 1))
    return config.error("parallel.pp",
                        what + ", but the model has only " + std::to_string(layers) + " layers");

  const std::vector<StageRange>& given = space.stages;
  if (!given.empty()) {
    if (static_cast<int64_t>(given.size()) != stages)
      return config.error("parallel.stages",
                          "lists " + std::to_string(given.size()) + " stages but " + what);
    int64_t next = 0;
    for (size_t k = 0; k < given.size(); ++k) {
      const int64_t a = given[k].first_layer, b = given[k].last_layer;
      const std::string entry =
          "entry " + std::to_string(k) + " [" + std::to_string(a) + ", " + std::to_string(b) + "]";
      if (a > b) return config.error("parallel.stages", entry + " ends before it starts");
      if (a < next)
        return config.error("parallel.stages", entry + " repeats layer " + std::to_string(a));
      if (a > next)
        return config.error("parallel.stages", entry + " skips layer " + std::to_string(next));
      if (b >= layers)
        return config.error("parallel.stages", entry + " goes past the last layer (" +
                                                   std::to_string(layers - 1) + ")");
      plan.first_layer.push_back(a);
      plan.last_layer.push_back(b);
      next = b + 1;
    }
    if (next != layers)
      return config.error("parallel.stages", "layers " + std::to_string(next) + ".." +
                                                 std::to_string(layers - 1) + " are in no stage");
  } else {
    // Contiguous split minimising the most expensive stage (dynamic programming over layers).
    const int64_t L = std::max<int64_t>(layers, 1);
    std::vector<double> prefix(static_cast<size_t>(L + 1), 0.0);
    for (int64_t l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + cost[static_cast<size_t>(l)];
    auto span = [&](int64_t a, int64_t b, int64_t k) {  // layers [a, b) as stage k
      return prefix[b] - prefix[a] + (k == 0 ? pre : 0) + (k == stages - 1 ? post : 0);
    };
    const double inf = std::numeric_limits<double>::infinity();
    // best[k][l]: the least max-cost of putting layers [0, l) into stages 0..k-1.
    std::vector<std::vector<double>> best(stages + 1, std::vector<double>(L + 1, inf));
    std::vector<std::vector<int64_t>> cut(stages + 1, std::vector<int64_t>(L + 1, 0));
    best[0][0] = 0;
    for (int64_t k = 1; k <= stages; ++k)
      for (int64_t l = k; l <= L; ++l)
        for (int64_t a = k - 1; a < l; ++a) {
          double c = std::max(best[k - 1][a], span(a, l, k - 1));
          if (c < best[k][l]) {
            best[k][l] = c;
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
  for (int64_t k = 0; k < stages; ++k) {
    double f = (k == 0 ? pre : 0) + (k == stages - 1 ? post : 0);
    for (int64_t l = plan.first_layer[k]; l <= plan.last_layer[k] && l < layers; ++l)
      f += cost[static_cast<size_t>(l)];
    plan.flops.push_back(f);
  }
  return plan;
}

}  // namespace loom::planner
