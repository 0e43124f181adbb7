// The one estimator of what a plan costs, on the one cost model (core/cost_model.h): per rank,
// the parameters held, peak memory by part, compute and communication time per step and the
// bytes sent by primitive. `loom plan` prints it, bench/model_plans compares plans with it and
// the planner ranks candidates by it. LibTorch-free.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/cost_model.h"
#include "core/strings.h"
#include "graph/graph.h"
#include "lower/fusion.h"
#include "lower/path.h"
#include "lower/program.h"
#include "plan/plan_spec.h"
#include "planner/cost.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace loom::plan {

// The pipeline schedule a plan runs, simulated at the cost model's block durations.
struct PipelineTimes {
  sched::Schedule schedule;                // what was simulated (durations in milliseconds)
  sched::Timeline timeline;                // its simulation, in milliseconds
  double bubble_ratio = 0;                 // idle device-time / (devices x makespan)
  double makespan_s = 0;                   // one step's blocks, first start to last end
  std::vector<double> busy_s;              // per pipeline device
  std::vector<double> peak_micro_batches;  // per pipeline device: most forwards held at once
};

struct RankEstimate {
  double parameters = 0;  // elements held
  double param_bytes = 0;
  double grad_bytes = 0;
  double optimizer_bytes = 0;    // AdamW: two moments; SGD: one buffer
  double grad_bucket_bytes = 0;  // flat buffers of the gradient all-reduces
  double activation_bytes = 0;   // one micro-batch's saved tensors x micro-batches in flight
  double optimizer_temporary_bytes = 0;
  double working_set_bytes = 0;  // the largest of activations, buckets, optimizer temporaries
  double micro_batches_in_flight = 0;
  double peak_bytes = 0;  // params + grads + optimizer + working set
  double compute_s = 0;   // per step, the schedule's makespan under pipelining
  double comm_s = 0;      // per step: adapters per micro-batch and the gradient all-reduces
  double step_s = 0;      // compute + comm
  double bubble = 0;      // this rank's idle fraction of the schedule
  std::map<std::string, double> sent;  // bytes per step by primitive
};

struct Estimate {
  std::vector<RankEstimate> ranks;
  double bubble_ratio = 0;
  double step_s = 0;  // the slowest rank's
  double max_peak_bytes() const;
  double max_activation_bytes() const;
  double max_parameters() const;
  double max_sent_bytes() const;  // the busiest sender's bytes per step
};

// Forward seconds of each rank's sub-operators for one micro-batch at the device's FLOP rate.
// `flops`: a memo of sub-ops' FLOPs to count with, kept across plans (one is made otherwise).
std::vector<double> forward_seconds(const graph::Graph& planned, int64_t world_size,
                                    const CostModel& cost, planner::FlopsMemo* flops = nullptr);
// The same from each op's FLOPs (planner::graph_flops of `planned`).
std::vector<double> forward_seconds(const graph::Graph& planned, int64_t world_size,
                                    const CostModel& cost, const std::vector<double>& op_flops);

// What parallel.recompute changes on each rank, per micro-batch (lower/recompute.h): the
// activation bytes its regions do not keep (made and read only inside a region, and what an
// attention core keeps for its backward), the largest of one region's (made again while that
// region's backward runs), and the forward seconds run again in the backward. `on_gpu`: the run's
// device is cuda (what attention keeps depends on its kernel, graph::fused_attention).
// `op_flops` (planner::graph_flops of `planned`) and `fused` (lower::fused_into_next of the
// plan): when the caller has them (made otherwise).
struct RecomputeCost {
  std::vector<double> dropped_bytes, largest_region_bytes, forward_s;
};
RecomputeCost recompute_cost(const graph::Graph& planned, const lower::Lowered& lowered,
                             const CostModel& cost, bool on_gpu = false,
                             const std::vector<double>* op_flops = nullptr,
                             const std::vector<bool>* fused = nullptr);

// What each rank of a lowered plan holds whatever its recomputation, schedule and ZeRO 0/1:
// the parameter elements its ops read, the largest piece and the gradients a piece read twice
// receives (bytes), one micro-batch's op outputs, saved extras and adapter deliveries before
// recomputation drops any (bytes), the largest op output and the gradient buckets' flat
// buffers. It reads the ops, the adapters, the fused ops and the run's device only, so plans
// sharing a lowering (PlanCache) share it. `fusion`: lower::fusion_of the plan.
struct LoweredBytes {
  std::vector<double> params, acts, largest_piece, incoming, largest_output, sync_buffer;
};
LoweredBytes lowered_bytes(const graph::Graph& planned, const lower::Lowered& lowered,
                           const lower::Fusion& fusion, bool on_gpu);

// What a lowered plan computes per micro-batch on a cost model: each rank's forward seconds and
// what recomputation changes. The estimate, the pipeline's simulation and the schedule search
// read the same figures.
// `fusion`: lower::fusion_of the plan, when the caller has it (found otherwise).
struct ComputeCost {
  std::vector<double> forward_s;
  RecomputeCost recompute;
  lower::Fusion fusion;  // lower::fusion_of the plan
  // lowered_bytes of the plan on the run's device, when the caller kept them (found otherwise).
  std::shared_ptr<const LoweredBytes> bytes;
};
ComputeCost compute_cost(const graph::Graph& planned, const lower::Lowered& lowered,
                         const CostModel& cost, bool on_gpu, const std::vector<double>& op_flops,
                         const lower::Fusion* fusion = nullptr);

// A rank's memory as estimate_plan counts it, split by what a pipeline schedule changes: what
// the rank holds whatever runs, and what each micro-batch in flight adds.
struct RankMemory {
  // Parameters, gradients, optimizer state, and what a backward holds besides the micro-batches
  // in flight (a parameter's incoming gradients; in a pipeline, half a micro-batch more).
  double held_bytes = 0;
  double activation_bytes = 0;  // one micro-batch's saved tensors and adapter deliveries
};
// Per rank of a lowered plan (the schedule's order does not matter). `compute`: the plan's
// compute_cost on the run's device, when the caller has it (it is computed otherwise; only its
// bytes are read).
std::vector<RankMemory> rank_memory(const PlanSpec& spec, const graph::Graph& planned,
                                    const lower::Lowered& lowered,
                                    const ComputeCost* compute = nullptr);

// The estimate of a lowered plan; `pipeline` from simulating its schedule (empty without one).
// `compute`: the plan's compute_cost on `cost` and the run's device, when the caller has it
// (computed otherwise).
Estimate estimate_plan(const PlanSpec& spec, const graph::Graph& planned,
                       const lower::Lowered& lowered, const CostModel& cost,
                       const PipelineTimes& pipeline, const ComputeCost* compute = nullptr);

// Seconds of the steps of `path` that `rank` takes part in (their cost-model cost).
// `all_to_all_fill`: the share of an all-to-all's pieces that crosses (a ragged one's).
double path_seconds(const lower::CommPath& path, int64_t rank, double all_to_all_fill = 1.0);
// A ring all-reduce of `bytes` over `devices`: 2 (k - 1) messages of bytes / k, on the network
// when the group spans nodes.
// How long a node's ranks take to compute `work_s` (each rank's seconds at device_flops_per_s)
// when they share the node's compute (node_flops_per_s): the busiest rank's finish.
double shared_compute_seconds(std::vector<double> work_s, const CostModel& cost);

double all_reduce_seconds(const CostModel& cost, const std::vector<DeviceId>& devices,
                          double bytes);

// Adds to `out`, per primitive, the bytes `rank` sends in the steps of `path` it takes part in,
// `times` over (once per micro-batch, say); all-to-all pieces count `all_to_all_fill` of their
// bytes.
void add_path_bytes(const lower::CommPath& path, const Shape& shape, int64_t elem, int64_t rank,
                    double times, std::map<std::string, double>& out, double all_to_all_fill = 1.0);

}  // namespace loom::plan
