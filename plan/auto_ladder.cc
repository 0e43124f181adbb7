// The auto-planner's memory ladder: a shape at each rung of recomputation and ZeRO until one
// fits, whole or on a data-parallel proxy with the rest of the world added from the cost model.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "core/check.h"
#include "core/training_state.h"
#include "lower/program.h"
#include "models/gpt.h"
#include "models/llama.h"
#include "plan/auto_plan_parts.h"

namespace loom::plan::auto_detail {

// The data-parallel ranks a shape's proxy keeps: one replica, or under expert parallelism one ep
// group (ep is carved out of dp and cannot be expressed with dp 1; a proxy of ep replicas routes
// tokens to every expert as the whole plan does).
int64_t proxy_dp(const Shape& shape) { return shape.ep; }

// The first `n` ranks of a shape's replica axes (dp x cp, tensor-parallel position 0 of the
// first stage): a group the cost model can price an all-reduce over (planner/mesh.h's order).
std::vector<DeviceId> replica_group(const Shape& shape, int64_t n) {
  std::vector<DeviceId> group;
  for (int64_t j = 0; j < n; ++j) group.push_back(DeviceId(j * shape.tp));
  return group;
}

// A plan's figures under ZeRO level `zero`, from its figures at zero 0 (or, on a data-parallel
// proxy, from the proxy's). ZeRO shards over the ranks a parameter is replicated on, dp x cp as
// the lowering does: ZeRO 1 keeps 1/(dp cp) of the optimizer state, ZeRO 3 1/(dp cp) of
// weights, gradients and state. On a proxy the whole plan's gradient all-reduce over dp x cp
// replaces the proxy's own over its proxy_dp x cp (ZeRO 1 moves the same bytes as a
// reduce-scatter and an all-gather; ZeRO 3 gathers every parameter in each micro-batch's forward
// and again for its backward, and reduce-scatters its gradient: 1.5 all-reduces per
// micro-batch). Expert parameters are replicated over dp / ep x cp only: a proxy counts all
// gradients as if over dp x cp (the top candidates are planned whole before they are ranked),
// and shares ZeRO's memory over dp / ep x cp, which never promises an expert rank memory it
// lacks.
AutoCandidate at_zero(const Search& s, const Shape& shape, const Estimate& e, int64_t zero,
                      bool proxy) {
  const double shards =
      static_cast<double>(proxy && shape.ep > 1 ? shape.replicas() / shape.ep : shape.replicas());
  const std::vector<DeviceId> all = replica_group(shape, shape.replicas());
  const std::vector<DeviceId> proxied = replica_group(shape, proxy_dp(shape) * shape.cp);
  const double m = static_cast<double>(s.config.batch.global / (shape.dp * shape.micro));
  AutoCandidate c;
  c.bubble = e.bubble_ratio;
  for (const RankEstimate& r : e.ranks) {
    double comm = r.comm_s;
    if (proxy) {
      const double sync = all_reduce_seconds(s.cost, all, r.grad_bytes);
      comm +=
          (zero == 3 ? 1.5 * m * sync : sync) - all_reduce_seconds(s.cost, proxied, r.grad_bytes);
    }
    double peak = r.peak_bytes;
    if (zero == 1) peak -= r.optimizer_bytes * (1 - 1 / shards);
    if (zero == 3) peak -= (r.param_bytes + r.grad_bytes + r.optimizer_bytes) * (1 - 1 / shards);
    c.peak_bytes = std::max(c.peak_bytes, peak);
    if (r.compute_s + comm > c.step_s) {
      c.step_s = r.compute_s + comm;
      c.compute_s = r.compute_s;
      c.comm_s = comm;
    }
  }
  return c;
}

// A shape's memory ladder: for each recomputation level, its plan at ZeRO 0 (on a proxy: one
// replica's) tells which ZeRO level fits; ZeRO 0 and 1 are tried at every level before ZeRO 3,
// whose gathers cost more than recomputation. On whole plans a rung other than the one planned
// is planned too, and counts only if its own estimate fits.
Outcome ladder(const Search& s, const Shape& shape, AutoCandidate& out, int64_t& planned) {
  const int64_t global = s.config.batch.global;
  // Weights, gradients and state over every rank at best (ZeRO 3 over dp x cp): a floor no rung
  // goes under.
  const double floor = s.parameters * s.bytes_per_parameter /
                       static_cast<double>(shape.tp * shape.pp * shape.replicas());
  if (floor > s.limit) return Outcome::kOverMemory;
  Shape planned_shape = shape;
  int64_t ranks = s.world;
  int64_t planned_global = global;
  if (!s.whole) {  // one replica (one ep group), the same micro-batches per replica
    planned_shape.dp = proxy_dp(shape);
    planned_global = global / shape.dp * planned_shape.dp;
    ranks = planned_shape.dp * shape.cp * shape.tp * shape.pp;
  }
  std::map<std::string, Result<Plan>> base;  // recompute level -> its plan at ZeRO 0
  auto plan_of = [&](const std::string& recompute) -> const Result<Plan>& {
    auto it = base.find(recompute);
    if (it != base.end()) return it->second;
    const Config config =
        with_spec(s.config, spec_of(s.user, planned_shape, {recompute, 0}, planned_global));
    ++planned;
    // A proxy's plan is estimated and dropped: the proofs are left to the whole plans kept.
    PlanProofs proofs;
    proofs.verify_graph = proofs.deadlock_free = proofs.equivalent = s.whole;
    Result<Plan> plan = make_plan(config, s.registries, s.cost, ranks, proofs, s.cache);
    return base.emplace(recompute, std::move(plan)).first->second;
  };
  bool any_valid = false;
  for (const std::vector<int64_t>& zeros : {std::vector<int64_t>{0, 1}, std::vector<int64_t>{3}})
    for (const char* recompute : kRecompute) {
      const Result<Plan>& plan = plan_of(recompute);
      if (!plan.ok()) {
        if (!any_valid) return Outcome::kInvalid;
        continue;
      }
      any_valid = true;
      for (int64_t zero : zeros) {
        if (!zero_applies(shape, zero)) continue;
        AutoCandidate c = at_zero(s, shape, plan->estimate, zero, !s.whole);
        if (c.peak_bytes > s.limit) continue;
        const Rung rung{recompute, zero};
        if (s.whole && zero != 0) {  // its own plan, its own figures
          const Config config = with_spec(s.config, spec_of(s.user, shape, rung, global));
          ++planned;
          auto exact = make_plan(config, s.registries, s.cost, s.world, {}, s.cache);
          if (!exact.ok()) continue;
          c = figures(exact->estimate);
          if (c.peak_bytes > s.limit) continue;
        }
        c.overrides = overrides_of(shape, rung, global);
        c.spec = spec_of(s.user, shape, rung, global);
        c.label = label_of(shape, rung);
        c.whole = s.whole;
        out = std::move(c);
        return Outcome::kFits;
      }
    }
  return any_valid ? Outcome::kOverMemory : Outcome::kInvalid;
}

}  // namespace loom::plan::auto_detail
