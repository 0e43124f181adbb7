// The estimator's parts shared by its files (estimate_memory.cc, estimate_compute.cc,
// estimate_comm.cc, estimate.cc): internal to plan/.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/graph.h"
#include "lower/program.h"
#include "plan/estimate.h"
#include "plan/plan_spec.h"

namespace loom::plan::estimate_detail {

// Bytes an op keeps for its backward pass besides its outputs.
double saved_extra_bytes(const graph::Graph& g, const graph::Op& op, bool on_gpu);

// A rank's gradient groups as the runtime forms them (lower/grad_bucketing.h): each group's
// ranks and the element counts of its pieces, in the executor's order.
struct GradGroups {
  std::vector<std::vector<DeviceId>> devices;
  std::vector<std::vector<int64_t>> numels;
};
GradGroups grad_groups(const lower::Lowered& lowered, size_t rank);

// What each rank holds and keeps, from its sub-operators, the adapters and the gradient syncs.
struct Holdings {
  std::vector<double> params, acts, largest_piece, incoming, sync_buffer;
  std::vector<double> recompute_bytes;  // the largest region's, while its backward runs
  std::vector<double> largest_output;   // the largest op output (e.g. the logits)
  std::vector<double> state_params;     // elements whose optimizer state the rank keeps
  std::vector<double> zero_segments;    // parallel.zero 1: reduced gradient segments held
  // parallel.zero 1 on gloo: its reduce-scatter (an all-to-all, then a local sum) receives every
  // member's copy of a bucket in a buffer of the bucket's size, for every bucket in flight.
  std::vector<double> zero_receive;
  // parallel.zero 3: gathered parameters at their largest (gather_costs).
  std::vector<double> gather_forward, gather_backward;
};

// What each rank of `world` holds; `c`: the plan's compute_cost (its recomputed regions, fused
// ops and, when kept, its lowered_bytes).
Holdings holdings(const PlanSpec& spec, const graph::Graph& planned, const lower::Lowered& lowered,
                  int64_t world, const ComputeCost& c);
// What a backward holds besides the saved activations, at its largest.
double backward_transient(const Holdings& h, size_t r);
// The micro-batches a pipeline stage holds besides those in flight, while it runs a backward.
double pipeline_extra_micro_batches(const PlanSpec& spec);
RankMemory memory_of(const PlanSpec& spec, const Holdings& h, size_t r);

// Every rank's communication per step through the adapters.
void add_adapter_communication(const graph::Graph& planned, const lower::Lowered& lowered, double m,
                               std::vector<RankEstimate>& ranks);
// A rank's gradient all-reduces, once per step.
void add_grad_sync(const PlanSpec& spec, const lower::Lowered& lowered, const CostModel& cost,
                   size_t r, RankEstimate& re);

}  // namespace loom::plan::estimate_detail
