// Repetend search (Tessel's idea, loom's own exact search). The steady state of a pipeline is a
// repeating pattern, the repetend, that runs every block of one placement instance once, the
// blocks drawn from consecutive instances. loom finds the repetend with the shortest period
// (fewest bubbles) whose steady state fits the memory limit, then completes it with a warm-up
// and a cool-down and unrolls it to m micro-batches.
//
// Method: modulo scheduling by branch and bound. For a candidate period T (from the per-device
// work bound upward) each block j gets a start s_j in the frame of one instance; instance k
// runs it at s_j + kT. Blocks of a device must not overlap modulo T, dependencies hold inside an
// instance (s_v >= s_u + span_u + comm), and the steady memory of device d at time x is
// sum_j mem_j * floor((x - e_j) / T) (e_j: start of an allocating block, end of a freeing one),
// which must stay within the limit. Blocks are branched in topological order over
// s_j in [earliest, earliest + T) (allocating blocks may also wait extra periods, which only
// lowers memory), pruned by device occupancy, free-gap fragmentation, the critical-path bound
// on the instance span, and memory bounds as soon as a device's allocating blocks are placed.
// The first period with a solution is optimal; among its solutions the shortest span wins.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"
#include "scheduler/placement.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace loom::sched {

struct SearchOptions {
  std::optional<double> memory_limit;  // per device; the placement's limit when absent
  double comm_delay = 0;               // between blocks that share no device (time units)
  int64_t node_limit = 20'000'000;     // per candidate period; past it optimality is not proved
  int extra_delay_periods = 1;         // how long an allocating block may wait beyond one period
};

struct Repetend {
  double period = 0;              // time units between two instances in the steady state
  double period_lower_bound = 0;  // the busiest device's work per instance
  std::vector<double> start;      // per placement block: start in instance 0's frame, min 0
  std::vector<int> offset;        // floor(start / period): instances back in the repetend window
  int instances_spanned = 1;      // 1 + the largest offset
  double span = 0;                // one instance, first start to last end
  std::vector<double> steady_memory;  // per device: peak in the steady state
  bool period_optimal = true;         // false only when a node limit cut a shorter period short
  bool span_optimal = true;
  int64_t nodes = 0;  // branch-and-bound nodes over all periods tried

  double bubble_ratio(const Placement& placement) const;  // idle share inside the repetend
  std::string to_string(const Placement& placement) const;
};

Result<Repetend> find_repetend(const Placement& placement, const SearchOptions& options = {});

struct SearchResult {
  Repetend repetend;
  Schedule schedule;
  Timeline timeline;
  double search_time_s = 0;    // repetend search + completion + verification
  double repetend_time_s = 0;  // the repetend search alone
  double warmup = 0;           // time before the first complete repetend instance starts
  double cooldown = 0;         // time after the last complete repetend instance ends
  int repetend_instances = 0;
  // Which completion won: "modulo" (the repetend unrolled as is), "list" (list scheduling by
  // the repetend's start times), "baseline-<rule>", each possibly "+justified".
  std::string completion;
};

// Unrolls a repetend to `instances` placement instances with the shortest of its completions;
// the result is validated and simulated, and respects the memory limit at every instant.
// Workloads over 50,000 blocks use the unrolled repetend only (list scheduling is quadratic).
Result<SearchResult> complete_repetend(const Placement& placement, const Repetend& repetend,
                                       int instances, const SearchOptions& options = {});

// find_repetend + complete_repetend for m micro-batches (a multiple of the placement's
// micro-batches per instance: 2 for the X-shape).
Result<SearchResult> search_schedule(const Placement& placement, int micro_batches,
                                     const SearchOptions& options = {});

// search_schedule's results by their inputs (the placement, the micro-batches and the options):
// plans that search the same block graph (the auto-planner's candidates that differ only in what
// the search does not see) search it once. Safe to share between threads.
class SearchMemo {
 public:
  // search_schedule(placement, micro_batches, options), or the result of an earlier call with
  // equal arguments.
  Result<SearchResult> search(const Placement& placement, int micro_batches,
                              const SearchOptions& options = {});
  int64_t searches() const;  // distinct inputs searched

 private:
  mutable std::mutex mutex_;
  std::map<std::string, Result<SearchResult>> found_;
};

}  // namespace loom::sched
