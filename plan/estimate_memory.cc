// The estimator's memory: what each rank holds (parameters, gradients, optimizer state,
// activations, buffers) from its sub-operators, the adapters and the gradient syncs.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "core/check.h"
#include "core/training_state.h"
#include "graph/ops_moe.h"
#include "lower/fusion.h"
#include "lower/grad_bucketing.h"
#include "lower/param_shards.h"
#include "lower/path.h"
#include "lower/recompute.h"
#include "plan/estimate_parts.h"
#include "planner/cost.h"
#include "scheduler/block.h"

namespace loom::plan {
namespace estimate_detail {

// Bytes an op keeps for its backward pass besides its outputs: its type's rule
// (graph::OpRules::saved_bytes).
double saved_extra_bytes(const graph::Graph& g, const graph::Op& op, bool on_gpu) {
  const graph::SavedBytesRule& rule = op.def->rules.saved_bytes;
  if (!rule || op.inputs.empty()) return 0;
  return rule({op, g.tensor(op.inputs[0].tensor).dtype, on_gpu});
}

GradGroups grad_groups(const lower::Lowered& lowered, size_t rank) {
  std::vector<int64_t> ids = lowered.programs[rank].grad_syncs;
  std::sort(ids.begin(), ids.end());  // the executor's order (executor.cc, add_grad_buckets)
  std::vector<std::vector<int64_t>> keys;
  for (int64_t id : ids) {
    keys.emplace_back();
    for (DeviceId d : lowered.grad_syncs[static_cast<size_t>(id)].devices)
      keys.back().push_back(d.value());
  }
  GradGroups g;
  for (const std::vector<size_t>& members : lower::group_in_order(keys)) {
    g.devices.push_back(lowered.grad_syncs[static_cast<size_t>(ids[members.front()])].devices);
    g.numels.emplace_back();
    for (size_t j : members)
      g.numels.back().push_back(
          numel(lowered.grad_syncs[static_cast<size_t>(ids[j])].piece.shape()));
  }
  return g;
}

namespace {

// Under parallel.zero 1, what a rank's shared pieces come to: the elements it owns (and keeps
// optimizer state for) of those it holds, and its segments of the reduced gradients, from the
// same bucketing as the runtime's (lower/grad_bucketing.h).
struct ZeroShare {
  double shared = 0, owned = 0, segments = 0;
};
ZeroShare zero_share(const PlanSpec& spec, const lower::Lowered& lowered, size_t rank) {
  ZeroShare z;
  const GradGroups g = grad_groups(lowered, rank);
  const std::vector<std::vector<DeviceId>>& groups = g.devices;
  const std::vector<std::vector<int64_t>>& numels = g.numels;
  for (size_t k = 0; k < groups.size(); ++k) {
    const auto members = static_cast<int64_t>(groups[k].size());
    const auto me =
        std::find(groups[k].begin(), groups[k].end(), DeviceId(static_cast<int64_t>(rank))) -
        groups[k].begin();
    for (const lower::BucketPlan& b :
         lower::plan_buckets(numels[k], 4, spec.bucket_bytes, members, /*zero1=*/true)) {
      z.segments += static_cast<double>(b.segment);
      for (size_t j = 0; j < b.params.size(); ++j) {
        const int64_t n = numels[k][b.params[j]];
        const auto [begin, end] = b.owned(j, n, me);
        z.shared += static_cast<double>(n);
        z.owned += static_cast<double>(end - begin);
      }
    }
  }
  return z;
}

// Whether collectives run as gloo's (CommTraits::collectives_through_all_to_all): either holds
// a copy as large as its larger side.
bool gloo_reduce_scatter(const PlanSpec& spec) {
  return spec.comm_traits().collectives_through_all_to_all;
}

// parallel.zero 3: what gathered parameter pieces cost rank `r` at their largest, walking its
// segments in item order (runtime/param_gather.cc). In a forward, next to the activations:
// a piece in use while the next one is gathered (gloo's all-to-all sends from a buffer of the
// gathered size). In a backward, when the activations of the layers before are what is left: a
// piece's gradient being reduce-scattered (gloo: an all-to-all's buffers besides it) while the
// previous linear's weight is gathered.
std::pair<double, double> gather_costs(const PlanSpec& spec, const graph::Graph& planned,
                                       const lower::Lowered& lowered, size_t r) {
  const double copies = gloo_reduce_scatter(spec) ? 2 : 1;
  double forward = 0, backward = 0;
  auto bytes = [&](const lower::Adapter& a) {
    const auto& t = planned.tensor(a.tensor);
    const auto pos =
        std::find(a.to.devices.begin(), a.to.devices.end(), DeviceId(static_cast<int64_t>(r))) -
        a.to.devices.begin();
    return static_cast<double>(numel(a.to.piece(pos, a.tensor, t.shape).shape()) *
                               size_bytes(t.dtype));
  };
  for (const lower::Segment& seg : lowered.programs[r].segments) {
    double previous = 0, previous_weight = 0;
    for (const lower::SegmentItem& it : seg.items) {
      if (it.kind != lower::SegmentItem::Kind::kAdapter) continue;
      const lower::Adapter& a = lowered.adapters[static_cast<size_t>(it.index)];
      if (!a.parameter) continue;
      const double p = bytes(a);
      forward = std::max(forward, previous + copies * p);
      backward = std::max(backward, (1 + copies) * p + (a.regather ? copies * previous_weight : 0));
      previous = p;
      if (a.regather) previous_weight = p;
    }
  }
  return {forward, backward};
}

}  // namespace

Holdings holdings(const PlanSpec& spec, const graph::Graph& planned, const lower::Lowered& lowered,
                  int64_t world, const ComputeCost& c) {
  const RecomputeCost& rc = c.recompute;
  const size_t n = static_cast<size_t>(world);
  Holdings h;
  for (auto* v : {&h.recompute_bytes, &h.state_params, &h.zero_segments, &h.zero_receive,
                  &h.gather_forward, &h.gather_backward})
    v->assign(n, 0);
  {
    LoweredBytes found;
    if (!c.bytes) found = lowered_bytes(planned, lowered, c.fusion, spec.on_gpu());
    const LoweredBytes& b = c.bytes ? *c.bytes : found;
    h.params = b.params;
    h.acts = b.acts;
    h.largest_piece = b.largest_piece;
    h.incoming = b.incoming;
    h.largest_output = b.largest_output;
    h.sync_buffer = b.sync_buffer;
  }
  // Recomputed regions keep only what crosses their border; one region's activations come back
  // while its backward runs. Only the bytes are read here, which no cost model changes.
  h.recompute_bytes = rc.largest_region_bytes;
  for (size_t r = 0; r < n; ++r) h.acts[r] -= rc.dropped_bytes[r];
  for (size_t r = 0; r < n; ++r)
    std::tie(h.gather_forward[r], h.gather_backward[r]) = gather_costs(spec, planned, lowered, r);
  // Optimizer state: every held element, or under ZeRO-1 only the owned shared ones.
  h.state_params = h.params;
  h.zero_segments.assign(n, 0);
  if (spec.zero == 1)
    for (size_t r = 0; r < n; ++r) {
      const ZeroShare z = zero_share(spec, lowered, r);
      h.state_params[r] = h.params[r] - z.shared + z.owned;
      // The summed segments are written inside the buckets, but for MPI (grad_buckets.cc).
      h.zero_segments[r] = spec.comm_traits().shard_out_of_place ? z.segments : 0.0;
      h.zero_receive[r] = gloo_reduce_scatter(spec) ? z.shared : 0.0;
    }
  return h;
}

// What a backward holds besides the saved activations, at its largest: the gradient of the
// largest activation and a buffer of its size (the loss's: the logits' gradient and the
// log-sum-exp backward's buffer, measured on GPT with a 4096-token vocabulary), or a recomputed
// region's activations, made again while its backward runs.
double backward_transient(const Holdings& h, size_t r) {
  return std::max(2 * h.largest_output[r], h.recompute_bytes[r]);
}

// A pipeline stage also holds, while it runs a backward, about half a micro-batch more: the
// received output gradients and the boundary tensors of the blocks around it (measured on GPT
// tiny; tests/e2e/multiprocess_test.cc checks the estimate on a gpt2-124m variant).
double pipeline_extra_micro_batches(const PlanSpec& spec) {
  return spec.mesh().pp() > 1 ? 0.5 : 0.0;
}

RankMemory memory_of(const PlanSpec& spec, const Holdings& h, size_t r) {
  RankMemory m;
  m.activation_bytes = h.acts[r];
  const TrainingStateBytes state = training_state_bytes(spec.optimizer);
  // A ZeRO-1 rank's reduced gradient segments are float32 gradients too.
  m.held_bytes = h.params[r] * (state.weight + state.grad) + h.state_params[r] * state.optimizer +
                 h.zero_segments[r] * state.grad + pipeline_extra_micro_batches(spec) * h.acts[r] +
                 std::max(h.incoming[r] + backward_transient(h, r), h.gather_forward[r]);
  return m;
}

}  // namespace estimate_detail

using namespace estimate_detail;

LoweredBytes lowered_bytes(const graph::Graph& planned, const lower::Lowered& lowered,
                           const lower::Fusion& fusion, bool on_gpu) {
  const size_t n = lowered.programs.size();
  LoweredBytes h;
  for (auto* v :
       {&h.params, &h.acts, &h.largest_piece, &h.incoming, &h.largest_output, &h.sync_buffer})
    v->assign(n, 0);
  // Under parallel.zero 3 a rank holds the shards it stores, not the pieces its ops read.
  const auto stored = lower::parameter_adapters(lowered);
  // Autograd sums the gradients of a parameter read by several ops (a tied embedding and LM
  // head) in its input buffer before accumulating: the two incoming gradients and their sum.
  // Keyed by the piece read (tensor id, value chunk and chunks, then its ranges): its bytes and
  // its readers.
  std::vector<std::map<std::vector<int64_t>, std::pair<double, int>>> uses(n);
  std::vector<int64_t> key;
  // A linear fused with its bias_add never materialises its own output, nor does a fused loss
  // chain its inner values (lower/fusion.h). A fused chain keeps its log-probabilities for the
  // backward where the unfused one keeps the logits: the same bytes, counted as the logits.
  std::vector<bool> fused = fusion.into_next;
  for (const lower::FusedLoss& c : fusion.losses)
    for (int64_t inner : {c.group_lse, c.lse, c.pick}) fused[static_cast<size_t>(inner)] = true;
  for (size_t i = 0; i < planned.ops().size(); ++i) {
    const graph::Op& op = planned.ops()[i];
    const size_t r = static_cast<size_t>(op.device.value());
    const double output_bytes = planner::op_output_bytes(planned, op);
    if (!fused[i]) h.acts[r] += output_bytes;
    h.largest_output[r] = std::max(h.largest_output[r], output_bytes);
    h.acts[r] += saved_extra_bytes(planned, op, on_gpu);
    for (const auto& read : op.inputs) {
      const auto& t = planned.tensor(read.tensor);
      if (t.role != graph::TensorRole::kParameter) continue;
      const graph::SubTensor* in = &read;
      graph::SubTensor shard_piece;
      if (!stored.empty())
        if (const auto shard = stored.find({t.id.value(), op.def->name}); shard != stored.end()) {
          shard_piece = lower::stored_piece(*shard->second, op.device, t.shape);
          in = &shard_piece;
        }
      key.assign({t.id.value(), in->value_chunk, in->value_chunks});
      for (const graph::Range& range : in->ranges) key.insert(key.end(), {range.start, range.end});
      auto [it, fresh] = uses[r].try_emplace(key, 0.0, 0);
      auto& u = it->second;
      const int64_t elements = planner::piece_elements(*in);
      u.first = static_cast<double>(elements * 4);
      ++u.second;
      if (fresh) {
        h.params[r] += static_cast<double>(elements);
        h.largest_piece[r] = std::max(h.largest_piece[r], static_cast<double>(elements * 4));
      }
    }
  }
  for (size_t r = 0; r < n; ++r)
    for (const auto& [name, u] : uses[r])
      h.incoming[r] = std::max(h.incoming[r], u.first * (u.second > 1 ? 2 : 1));
  // What an adapter delivers is a new tensor on each consumer rank (an all-reduced sum, a
  // gathered or received piece), held while its micro-batch is in flight like an op output.
  for (const auto& a : lowered.adapters) {
    if (a.parameter) continue;  // gather_costs
    const auto& t = planned.tensor(a.tensor);
    for (int64_t pos = 0; pos < a.to.size(); ++pos)
      h.acts[static_cast<size_t>(a.to.devices[static_cast<size_t>(pos)].value())] +=
          static_cast<double>(numel(a.to.piece(pos, a.tensor, t.shape).shape()) *
                              size_bytes(t.dtype));
  }
  // The flat buffer each gradient all-reduce bucket is copied into while it is reduced.
  for (size_t r = 0; r < n; ++r)
    for (int64_t id : lowered.programs[r].grad_syncs)
      h.sync_buffer[r] +=
          static_cast<double>(numel(lowered.grad_syncs[static_cast<size_t>(id)].piece.shape()) * 4);
  return h;
}

std::vector<RankMemory> rank_memory(const PlanSpec& spec, const graph::Graph& planned,
                                    const lower::Lowered& lowered, const ComputeCost* compute) {
  const int64_t world = static_cast<int64_t>(lowered.programs.size());
  // Only the bytes are read, which no cost model changes.
  std::optional<ComputeCost> computed;
  if (!compute)
    computed = compute_cost(planned, lowered, CostModel::builtin(), spec.on_gpu(),
                            planner::graph_flops(planned));
  const ComputeCost& c = compute ? *compute : *computed;
  const Holdings h = holdings(spec, planned, lowered, world, c);
  std::vector<RankMemory> out;
  for (size_t r = 0; r < static_cast<size_t>(world); ++r) out.push_back(memory_of(spec, h, r));
  return out;
}

}  // namespace loom::plan
