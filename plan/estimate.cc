#include "plan/estimate.h"

#include <algorithm>
#include <map>
#include <optional>

#include "core/training_state.h"
#include "plan/estimate_parts.h"
#include "planner/cost.h"
#include "scheduler/block.h"

namespace loom::plan {
namespace {

using namespace estimate_detail;

// A rank's memory with `in_flight` micro-batches of activations held at once. Activations (and
// a pipeline backward's extra, pipeline_extra_micro_batches), gradient buckets (reduced after the
// last backward, when activations are gone) and the optimizer's temporaries come one after the
// other; the backward also holds a parameter's incoming gradients before they are accumulated.
// memory_of splits the same figures for the schedule search.
void add_memory(const PlanSpec& spec, const Holdings& h, size_t r, double in_flight,
                RankEstimate& re) {
  // The optimizer's step makes temporaries the size of the piece it updates: AdamW's sqrt and
  // denominator, SGD's decayed gradient.
  const bool adamw = spec.optimizer == OptimizerKind::kAdamw;
  const double opt_temporaries = adamw ? 2 : spec.weight_decay ? 1 : 0;
  const TrainingStateBytes state = training_state_bytes(spec.optimizer);
  const RankMemory mem = memory_of(spec, h, r);
  re.micro_batches_in_flight = in_flight + pipeline_extra_micro_batches(spec);
  re.parameters = h.params[r];
  re.param_bytes = h.params[r] * state.weight;
  re.grad_bytes = h.params[r] * state.grad;
  re.grad_bucket_bytes = h.sync_buffer[r] + h.zero_receive[r] * 4;
  // Under ZeRO-1: state only for what this rank owns (and on MPI its reduced segments).
  re.optimizer_bytes = h.state_params[r] * state.optimizer + h.zero_segments[r] * state.grad;
  re.activation_bytes = mem.activation_bytes * re.micro_batches_in_flight;
  re.optimizer_temporary_bytes = opt_temporaries * h.largest_piece[r];
  re.working_set_bytes = std::max({re.grad_bucket_bytes,
                                   re.activation_bytes + h.incoming[r] + backward_transient(h, r),
                                   re.activation_bytes + h.gather_forward[r], h.gather_backward[r],
                                   re.optimizer_temporary_bytes});
  re.peak_bytes = re.param_bytes + re.grad_bytes + re.optimizer_bytes + re.working_set_bytes;
}

}  // namespace

double Estimate::max_peak_bytes() const {
  double m = 0;
  for (const auto& r : ranks) m = std::max(m, r.peak_bytes);
  return m;
}
double Estimate::max_activation_bytes() const {
  double m = 0;
  for (const auto& r : ranks) m = std::max(m, r.activation_bytes);
  return m;
}
double Estimate::max_parameters() const {
  double m = 0;
  for (const auto& r : ranks) m = std::max(m, r.parameters);
  return m;
}
double Estimate::max_sent_bytes() const {
  double m = 0;
  for (const auto& r : ranks) {
    double s = 0;
    for (const auto& [k, b] : r.sent) s += b;
    m = std::max(m, s);
  }
  return m;
}

Estimate estimate_plan(const PlanSpec& spec, const graph::Graph& planned,
                       const lower::Lowered& lowered, const CostModel& cost,
                       const PipelineTimes& pipeline, const ComputeCost* compute) {
  const int64_t world = static_cast<int64_t>(lowered.programs.size());
  const size_t n = static_cast<size_t>(world);
  const double m = static_cast<double>(spec.micro_batches());
  const int64_t ranks_per_stage = spec.mesh().size() / spec.mesh().pp();
  // One pass over the recomputed regions gives their seconds on `cost` and, on the run's
  // device, their bytes.
  std::optional<ComputeCost> computed;
  if (!compute)
    computed = compute_cost(planned, lowered, cost, spec.on_gpu(), planner::graph_flops(planned));
  const std::vector<double>& fwd = compute ? compute->forward_s : computed->forward_s;
  const RecomputeCost& rc = compute ? compute->recompute : computed->recompute;
  const std::vector<double>& refwd = rc.forward_s;
  const Holdings h = holdings(spec, planned, lowered, world, compute ? *compute : *computed);
  const bool pipelined = !pipeline.busy_s.empty();

  // Micro-batches whose activations a rank holds at once: the schedule's peak for pipelines;
  // one without (each micro-batch's backward follows its forward: lower/program.h).
  const double flat_units = 1.0;

  // Each rank's compute at the device's rate: forward and backward (sched::block_time) of every
  // micro-batch, the backward running the recomputed forward again.
  auto stage_of = [&](size_t r) {
    return static_cast<size_t>(static_cast<int64_t>(r) / ranks_per_stage);
  };
  std::vector<double> busy(n);
  for (size_t r = 0; r < n; ++r)
    busy[r] = m * (sched::block_time(sched::BlockKind::kF, fwd[r]) +
                   sched::block_time(sched::BlockKind::kB, fwd[r], refwd[r]));
  // Ranks that share a node's compute (CPU ranks on fewer cores than ranks) finish no sooner
  // than the node's work shared out as the operating system shares cores.
  std::map<int64_t, std::vector<double>> node_work;
  for (size_t r = 0; r < n; ++r)
    node_work[static_cast<int64_t>(r) / cost.devices_per_node].push_back(busy[r]);
  std::map<int64_t, double> node_s;
  for (const auto& [node, work] : node_work) node_s[node] = shared_compute_seconds(work, cost);

  Estimate e;
  e.bubble_ratio = pipeline.bubble_ratio;
  e.ranks.resize(n);
  add_adapter_communication(planned, lowered, m, e.ranks);
  for (size_t r = 0; r < n; ++r) {
    RankEstimate& re = e.ranks[r];
    const size_t stage = stage_of(r);
    // Compute: the rank's busy time, or the pipeline schedule's makespan with this rank's stage
    // idle for its bubble; at least its node's share.
    re.compute_s = busy[r];
    if (pipelined) {
      re.compute_s = pipeline.makespan_s;
      if (stage < pipeline.busy_s.size() && pipeline.makespan_s > 0)
        re.bubble = 1 - pipeline.busy_s[stage] / pipeline.makespan_s;
    }
    re.compute_s = std::max(re.compute_s, node_s[static_cast<int64_t>(r) / cost.devices_per_node]);
    add_grad_sync(spec, lowered, cost, r, re);
    re.step_s = re.compute_s + re.comm_s;

    const double in_flight = pipelined && stage < pipeline.peak_micro_batches.size()
                                 ? pipeline.peak_micro_batches[stage]
                                 : flat_units;
    add_memory(spec, h, r, in_flight, re);
    e.step_s = std::max(e.step_s, re.step_s);
  }
  return e;
}

}  // namespace loom::plan
