// The order of pipeline blocks each rank runs, from parallel.schedule and the scheduler.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "core/result.h"
#include "core/run_spec.h"
#include "lower/program.h"
#include "scheduler/csv.h"
#include "scheduler/placement.h"
#include "scheduler/repetend.h"
#include "scheduler/schedule.h"
#include "scheduler/schedule_spec.h"

namespace loom::lower {

// What one micro-batch costs a pipeline device, on the plan's cost model (plan/plan.cc takes
// the figures from plan/estimate.h).
struct StageCost {
  double forward_s = 0;  // its slowest rank's forward of one micro-batch; a backward takes 2x
  // The rank with the least room for activations: one micro-batch's activations, held from its
  // forward to its backward, and what that rank holds whatever the schedule runs (parameters,
  // gradients, optimizer state, a backward's working memory), in bytes.
  double activation_bytes = 0;
  double held_bytes = 0;
  double recompute_s = 0;  // the forward its backward runs again (parallel.recompute)
};

// Per pipeline device (pp index) what its blocks cost; `device_memory_bytes` is the cost
// model's memory of one device (0: not given).
struct StageCosts {
  std::vector<StageCost> devices;
  double device_memory_bytes = 0;
};

// Each rank's blocks and the schedule they come from.
struct PipelineOrder {
  // Per rank, its (kind, stage, micro-batch) blocks; empty without pipeline parallelism.
  std::vector<std::vector<ProgramBlock>> ranks;
  // The schedule the ranks run, built once (null without pipeline parallelism). Searched: the
  // schedule found, its blocks at the stage costs' durations in milliseconds (a forward of
  // device d takes devices[d].forward_s). Predefined and imported: at sched::block_time of a
  // forward of 1 per stage chunk. Memory in micro-batches of activations (+1 on F, -1 on B).
  std::shared_ptr<const sched::Schedule> schedule;
  // parallel.schedule csv: how the file named its backwards (torch's older B + W, or I + W).
  std::optional<sched::CsvActions> csv_actions;
};

// What a pipeline's order is made from (plan::PlanSpec::pipeline() of the plan's spec).
struct PipelineRequest {
  sched::ScheduleSpec schedule = sched::ScheduleSpec::predefined(sched::ScheduleKind::k1F1B);
  int64_t pp = 1;               // pipeline devices (parallel.pp)
  int64_t chunks = 1;           // stages per pipeline device (parallel.chunks)
  BatchSpec batch;              // where a step's micro-batches come from (for messages)
  int64_t ranks_per_stage = 1;  // dp x cp x tp: the ranks of one pipeline device
  // Micro-batches per step (batch.micro_batches() unless a caller orders fewer).
  int64_t micro_batches = 1;
};

// The search's input for parallel.schedule search: one micro-batch's V-shaped block graph
// (stage d on device d; for search-zb ZB-H1's, each backward split into I and W) with spans from
// `costs` in units of the slowest forward (rounded to 1/kSearchGrid of it: the search branches over
// integer time slots, and finer ones multiply its work), memory deltas as shares of each device's
// room for activations and a memory limit of 1. Without costs (or device memory) every F adds one
// micro-batch and the limit is pp micro-batches in flight. Errors name parallel.schedule when a
// device cannot hold one micro-batch's activations.
constexpr int kSearchGrid = 4;
// Branch-and-bound nodes per candidate period when a plan searches its schedule: every plan
// (loom plan, loom train) makes one, so the search stops proving optimality past this; the
// completion's list-scheduled and baseline candidates still compete (scheduler/repetend.h).
constexpr int64_t kSearchNodeLimit = 100'000;
// `split_backward`: search-zb's placement, each backward split into I and W.
// Errors carry their config key (Error::at).
Result<sched::Placement> search_placement(int64_t pp, bool split_backward, const StageCosts& costs);

// Each rank's blocks for request.schedule with its micro-batches; rank r runs the
// blocks of pipeline device (r's pp coordinate). Empty without pipeline parallelism. Chimera's
// up pipeline runs stages p..2p-1 (planner/chimera.h); zb-h1's split backward runs as I and W
// blocks. csv runs the rows of parallel.schedule_csv (errors name the key, the file and the
// cell; Error::at: the caller adds where the key came from). Only the search reads `costs`
// (empty: uniform stages, pp micro-batches in flight); predefined schedules follow their own
// rules. `searches`, when given, answers a search it has made before (plans of the same pipeline
// share it).
Result<PipelineOrder> pipeline_order(const PipelineRequest& request, const StageCosts& costs = {},
                                     sched::SearchMemo* searches = nullptr);

}  // namespace loom::lower
