// parallel.policy: auto. The planner chooses the plan: data, context, expert, tensor (or the
// model's own: window, DAP), sequence and pipeline degrees, chunks, micro-batch size, pipeline
// schedule (every predefined one and the repetend search at the plan's own block costs),
// recomputation and ZeRO level, searched together on the one cost model under a per-device
// memory limit.
//
// Every candidate is a config (the user's with parallel.* and batch.micro replaced) planned by
// make_plan, so what the search compares is what `loom plan` prints for that config.
//
// - Skeletons first: every policy, tp (within a node), cp, pp, dp, ep and micro-batch size
//   (world = dp x cp x tp x pp), in 1F1B order with sequence parallelism on tp. Then the best
//   `expand` skeletons again under every other schedule (GPipe, ZB-H1, interleaved, Chimera, the
//   repetend search with and without the split backward) and tp without sp.
// - Context parallelism (cp_kind p2p, the hybrid policy, model types that declare it: GPT and
//   Llama) is searched from the start for sequences of 8192 tokens or more, cutting them into
//   chunks of at least 1024 tokens: below that a sample's activations are small next to the
//   weights, and a ring sending key/value chunks in every attention layer would only multiply
//   the shapes with losers. When nothing fits the memory, every other cut of the sequence is
//   searched in a second pass, whatever its length.
// - Expert parallelism (models with experts: GPT's and Llama's model.args.moe) is carved out of
//   dp: ep runs over the divisors of dp that divide the experts; the world size is unchanged.
// - Memory prunes first: a shape whose weights, gradients and optimizer state alone exceed the
//   limit at best (split over every rank) is not planned. Otherwise it takes the first rung of
//   its memory ladder that fits: for each recomputation level (none, selective, full) in turn
//   ZeRO 0 then 1 (free in time), and only then ZeRO 3 at each level (its gathers cost more than
//   recomputing). ZeRO shards over dp x cp, the ranks a parameter is replicated on, as the
//   lowering does. One plan per recomputation level tells which ZeRO level fits; the rung chosen
//   is then planned itself.
// - Large worlds (more ranks than `exact_ranks`) are searched on data-parallel proxies: the plan
//   of one replica (dp 1, the same micro-batches per replica; cp, tp and pp as the shape has
//   them), with the gradient all-reduce over dp x cp (or ZeRO-3's gathers) in place of the
//   proxy's own over cp, and the ZeRO shares, added from the cost model. ep cannot be expressed
//   with dp 1, so a shape with ep keeps one ep group: its proxy has dp = ep (every expert, and
//   the all-to-all that reaches it, as in the whole plan), and its ZeRO shares count the experts'
//   replicas (dp / ep x cp), not dp x cp, so a proxy never promises memory an expert rank lacks.
//   Proxies with cp or ep stay within tp's node times 32 stages ranks, the largest proxy without
//   them. The best `top` are then planned whole and ranked on their own estimates. What a proxy
//   does not see: a mixture's router statistics (its load-balancing loss) are all-reduced over
//   dp in every micro-batch, over the proxy's own ep ranks only on a proxy (nowhere with ep 1),
//   so mixtures' proxies underestimate those small all-reduces; the whole plans carry them.
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
  std::vector<std::string> overrides;  // what makes it of the user's config
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
