// parallel.policy: auto. The planner chooses the plan (degrees, chunks, micro-batch size,
// schedule, recomputation and ZeRO level) on the one cost model under a per-device memory limit.
// Each candidate is a PlanSpec planned by make_plan, so what the search compares is what
// `loom plan` prints for it. How the search runs (skeletons, context and expert parallelism,
// the memory ladder, data-parallel proxies for large worlds) is said next to each step in
// auto_plan.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.h"

namespace loom::plan {

struct AutoOptions {
  int64_t top = 5;           // candidates planned whole and listed
  int64_t expand = 4;        // best skeletons whose other schedules (and tp without sp) are tried
  int64_t exact_ranks = 64;  // worlds up to this are searched on whole plans
  int64_t threads = 0;       // 0: the machine's cores
};

// One plan the search considered.
struct AutoCandidate {
  std::vector<std::string> overrides;  // what makes it of the user's config, as key=value
  PlanSpec spec;                       // the candidate's split, schedule, memory features, batch
  std::string label;                   // "dp2 tp2 pp2 mb2 1f1b", "dp4 ep2 cp2 tp1 pp1 mb1"
  double step_s = 0;
  double peak_bytes = 0;  // the busiest rank's
  double bubble = 0;
  double comm_s = 0;     // the slowest rank's communication per step
  double compute_s = 0;  // its compute (the schedule's makespan under pipelining)
  bool whole = false;    // estimated on the whole plan (not a data-parallel proxy)
};

struct AutoPlan {
  Config config;                   // the winner's: the user's config with its overrides
  Plan plan;                       // the winner's plan
  std::vector<AutoCandidate> top;  // best first, the winner at 0; all planned whole
  int64_t considered = 0;          // shapes tried
  int64_t with_cp = 0;             // of them, with context parallelism (cp > 1)
  int64_t with_ep = 0;             // of them, with expert parallelism (ep > 1)
  int64_t planned = 0;             // plans made (proxies included)
  int64_t over_memory = 0;         // shapes with no rung of the ladder under the limit
  int64_t invalid = 0;             // shapes the model or the schedule rules out
  double memory_limit_bytes = 0;
  double seconds = 0;  // the search's wall time
};

// The best plan of `config` (parallel.policy: auto) for `world_size` ranks on `cost`. Fails
// naming parallel.memory_limit_gb when no candidate fits.
Result<AutoPlan> auto_plan(const Config& config, const Registries& registries,
                           const CostModel& cost, int64_t world_size,
                           const AutoOptions& options = {});

// `config`'s own layout (its parallel.* and batch.micro) at the first rung of the memory ladder
// that fits, as the search would take it: what a hand-picked layout is compared with.
Result<AutoCandidate> plan_within_memory(const Config& config, const Registries& registries,
                                         const CostModel& cost, int64_t world_size);

// The table `loom plan` prints: the top candidates with step time, peak memory, bubble and
// communication, and why the winner won.
std::string describe(const AutoPlan& result);

}  // namespace loom::plan
