// The auto-planner's parts shared by its files: the candidates (auto_candidates.cc), the memory
// ladder (auto_ladder.cc) and the search (auto_plan.cc). Internal to plan/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/cost_model.h"
#include "plan/auto_plan.h"
#include "plan/plan.h"
#include "plan/plan_spec.h"

namespace loom::plan::auto_detail {

// What a candidate is before its memory ladder: how the model is split and ordered.
struct Shape {
  std::string policy;  // hybrid, or the model's own (window, dap) of degree tp
  // world = dp x cp x tp x pp; ep is carved out of dp (it divides dp).
  int64_t dp = 1, cp = 1, ep = 1, tp = 1, pp = 1, chunks = 1, micro = 1;
  sched::ScheduleSpec schedule = sched::ScheduleSpec::predefined(sched::ScheduleKind::k1F1B);
  bool sp = false;

  // The ranks a parameter outside the experts is replicated over: ZeRO shards over them.
  int64_t replicas() const { return dp * cp; }
};

// A rung of the memory ladder: recomputation and ZeRO level.
struct Rung {
  std::string recompute = "none";
  int64_t zero = 0;
};

// Recomputation levels in the order of what they cost (an extra forward of the attention
// cores, then of every layer).
const char* const kRecompute[] = {"none", "selective", "full"};

// What the model offers to split besides the batch, the layers and tensor-parallel dimensions.
struct ModelSplits {
  int64_t seq = 0;      // the sequence context parallelism may cut; 0: none (not a decoder)
  int64_t experts = 0;  // the routed experts expert parallelism may split; 0: a dense model
};

// A sequence this long (tokens) has context parallelism searched from the start. Below it a
// sample's activations are small next to the weights, so data, tensor and pipeline splits and
// recomputation bring a plan under the limit for less than a ring that sends key/value chunks in
// every attention layer, and cp would multiply the shapes only to add losers. The threshold is
// the planner's choice (where long-context training usually starts), not a measured crossover;
// shorter sequences still get cp when nothing fits without it (CpSearch::kFallback).
constexpr int64_t kLongSequence = 8192;
// Fewest tokens per context-parallel chunk in that search: a ring step's attention work grows
// with the chunk squared and its message only with the chunk, so short chunks leave the sends
// exposed; it also bounds cp by seq / 1024 (8 for 8192 tokens).
constexpr int64_t kMinCpChunk = 1024;

// Which context-parallel degrees a pass of skeletons takes.
enum class CpSearch {
  kLong,      // cp 1, and for a sequence of kLongSequence or more each cut of kMinCpChunk or more
  kFallback,  // the other cuts of the sequence (cp > 1): nothing kLong took fitted the memory
};

// The search's state: the user's config, what is searched with.
struct Search {
  const Config& config;
  PlanSpec user;  // the user's config's spec, what a candidate's spec starts from
  const Registries& registries;
  const CostModel& cost;
  int64_t world = 0;
  double limit = 0;
  bool whole = true;               // plan each candidate whole; else on a data-parallel proxy
  double bytes_per_parameter = 0;  // weights, gradients and optimizer state (training_state_bytes)
  double parameters = 0;           // of the single-device model
  ModelSplits model;               // the sequence and experts cp and ep may split
  PlanCache* cache = nullptr;      // what the candidates' plans share (their models, searches)
};

enum class Outcome { kFits, kOverMemory, kInvalid };

// Whether ZeRO level `zero` applies to shape `s` (replicas to shard over; no zero 3 with W blocks).
bool zero_applies(const Shape& s, int64_t zero);
// What makes shape `s` at rung `r` of the user's config, as key=value (what describe() prints).
std::vector<std::string> overrides_of(const Shape& s, const Rung& r, int64_t global);
// The spec of shape `s` at rung `r` with `global` samples per step, the rest as `user`'s.
PlanSpec spec_of(const PlanSpec& user, const Shape& s, const Rung& r, int64_t global);
// "dp2 tp2 pp2 mb2 1f1b": a candidate's label.
std::string label_of(const Shape& s, const Rung& r);
// The most ranks a data-parallel proxy may have.
int64_t max_proxy_ranks(const CostModel& cost);
// The skeletons of `world` ranks (policy, degrees, micro-batch size; the plain order).
std::vector<Shape> skeletons(const Config& config, const Registries& registries,
                             const CostModel& cost, const ModelSplits& model, CpSearch cp_search,
                             int64_t world, bool whole);
// The other orders and splits of a skeleton.
std::vector<Shape> variants(const Shape& skeleton, int64_t global);
// The busiest rank's figures of an estimate.
AutoCandidate figures(const Estimate& e);
// What config's model offers cp and ep.
Result<ModelSplits> model_splits(const Config& config, const Registries& registries);

// The data-parallel ranks a shape's proxy keeps.
int64_t proxy_dp(const Shape& shape);
// Shape `shape`'s first rung of its memory ladder that fits (into `out`), counting the plans
// made into `planned`.
Outcome ladder(const Search& s, const Shape& shape, AutoCandidate& out, int64_t& planned);

}  // namespace loom::plan::auto_detail
