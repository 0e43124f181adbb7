// The estimator's compute: each rank's forward seconds on the cost model, what recomputation
// drops and runs again, and ranks sharing a node's compute.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "core/check.h"
#include "core/training_state.h"
#include "graph/ops_moe.h"
#include "graph/precision.h"
#include "lower/fusion.h"
#include "lower/grad_bucketing.h"
#include "lower/param_shards.h"
#include "lower/path.h"
#include "lower/recompute.h"
#include "plan/estimate_parts.h"
#include "planner/cost.h"
#include "scheduler/block.h"

namespace loom::plan {
namespace {

using estimate_detail::saved_extra_bytes;

// What a recomputed region drops and runs again on its rank.
struct RegionCost {
  double dropped_bytes = 0;
  double flops = 0;
};

RegionCost region_cost(const graph::Graph& g, const lower::Lowered& lowered,
                       const std::vector<bool>& fused, const lower::ProgramReaders& readers,
                       const lower::Program& prog, size_t segment,
                       const lower::RecomputeRegion& region, int64_t rank, bool on_gpu,
                       const std::vector<double>& op_flops) {
  RegionCost c;
  const lower::Segment& seg = prog.segments[segment];
  const lower::RegionBorder border = readers.border(segment, region);
  const std::set<int64_t> kept(border.tensors.begin(), border.tensors.end());
  const std::set<int64_t> handed_on(border.adapters.begin(), border.adapters.end());
  for (int64_t i = region.begin; i < region.end; ++i) {
    const lower::SegmentItem& it = seg.items[static_cast<size_t>(i)];
    if (it.kind == lower::SegmentItem::Kind::kAdapter) {
      const lower::Adapter& a = lowered.adapters[static_cast<size_t>(it.index)];
      if (handed_on.count(a.id)) continue;
      const auto& t = g.tensor(a.tensor);
      for (int64_t pos = 0; pos < a.to.size(); ++pos)
        if (a.to.devices[static_cast<size_t>(pos)].value() == rank)
          c.dropped_bytes += static_cast<double>(numel(a.to.piece(pos, a.tensor, t.shape).shape()) *
                                                 size_bytes(t.dtype));
      continue;
    }
    const auto index = static_cast<size_t>(it.index);
    const graph::Op& op = g.ops()[index];
    c.flops += op_flops[index];
    c.dropped_bytes += saved_extra_bytes(g, op, on_gpu);
    if (fused[index]) continue;
    bool keeps = false;
    for (const auto& out : op.outputs) keeps = keeps || kept.count(out.tensor.value()) > 0;
    if (!keeps) c.dropped_bytes += planner::op_output_bytes(g, op);
  }
  return c;
}

}  // namespace

RecomputeCost recompute_cost(const graph::Graph& planned, const lower::Lowered& lowered,
                             const CostModel& cost, bool on_gpu,
                             const std::vector<double>* op_flops,
                             const std::vector<bool>* fused_ops) {
  const size_t n = lowered.programs.size();
  RecomputeCost out{std::vector<double>(n, 0), std::vector<double>(n, 0),
                    std::vector<double>(n, 0)};
  std::vector<bool> own_fused;  // made when a rank recomputes and no fused_ops came
  const std::vector<bool>* fused = fused_ops;
  std::optional<lower::AdapterReads> reads;  // made once, when a rank recomputes
  std::vector<double> own_flops;             // counted when a rank recomputes and no op_flops came
  const std::vector<double>* flops_of = op_flops;
  for (size_t r = 0; r < n; ++r) {
    const lower::Program& prog = lowered.programs[r];
    bool any = false;
    for (const auto& seg : prog.segments) any = any || !seg.recompute.empty();
    if (!any) continue;
    if (!reads) reads = lower::adapter_reads(lowered);
    if (!fused) {
      own_fused = lower::fused_into_next(planned, lowered);
      fused = &own_fused;
    }
    if (!flops_of) {
      own_flops = planner::graph_flops(planned);
      flops_of = &own_flops;
    }
    const lower::ProgramReaders readers(planned, lowered, *reads, prog);
    for (size_t s = 0; s < prog.segments.size(); ++s)
      for (const lower::RecomputeRegion& region : prog.segments[s].recompute) {
        const RegionCost c = region_cost(planned, lowered, *fused, readers, prog, s, region,
                                         static_cast<int64_t>(r), on_gpu, *flops_of);
        out.dropped_bytes[r] += c.dropped_bytes;
        out.largest_region_bytes[r] = std::max(out.largest_region_bytes[r], c.dropped_bytes);
        if (cost.device_flops_per_s > 0) out.forward_s[r] += c.flops / cost.device_flops_per_s;
      }
  }
  return out;
}

double shared_compute_seconds(std::vector<double> work_s, const CostModel& cost) {
  // Water-filling: with k ranks still busy each runs at min(device rate, node rate / k); the
  // lightest finishes first and leaves its share to the rest.
  std::sort(work_s.begin(), work_s.end());
  const double device = cost.device_flops_per_s, node = cost.node_compute_flops_per_s();
  double t = 0, done = 0;
  for (size_t i = 0; i < work_s.size(); ++i) {
    const double busy = static_cast<double>(work_s.size() - i);
    t += (work_s[i] - done) * std::max(1.0, busy * device / node);
    done = work_s[i];
  }
  return t;
}

std::vector<double> forward_seconds(const graph::Graph& planned, int64_t world_size,
                                    const CostModel& cost, planner::FlopsMemo* flops) {
  return forward_seconds(planned, world_size, cost, planner::graph_flops(planned, flops));
}

std::vector<double> forward_seconds(const graph::Graph& planned, int64_t world_size,
                                    const CostModel& cost, const std::vector<double>& op_flops) {
  std::vector<double> fwd(static_cast<size_t>(world_size), 0);
  for (size_t i = 0; i < planned.ops().size(); ++i)
    fwd[static_cast<size_t>(planned.ops()[i].device.value())] +=
        op_flops[i] / cost.device_flops_per_s;
  return fwd;
}

ComputeCost compute_cost(const graph::Graph& planned, const lower::Lowered& lowered,
                         const CostModel& cost, bool on_gpu, const std::vector<double>& op_flops,
                         const lower::Fusion* fusion) {
  ComputeCost out;
  out.fusion = fusion ? *fusion : lower::fusion_of(planned, lowered);
  out.forward_s =
      forward_seconds(planned, static_cast<int64_t>(lowered.programs.size()), cost, op_flops);
  out.recompute = recompute_cost(planned, lowered, cost, on_gpu, &op_flops, &out.fusion.into_next);
  return out;
}

}  // namespace loom::plan
