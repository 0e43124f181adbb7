#include "plan/estimate.h"

#include <algorithm>
#include <cstdio>
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
#include "planner/cost.h"
#include "scheduler/block.h"

namespace loom::plan {
namespace {

// Bytes an op keeps for its backward pass besides its outputs. Attention with LibTorch's fused
// kernel keeps its output in the heads' layout and each query's log-sum-exp (float32); with the
// explicit products, its softmax probabilities [b, h, s, t] and per-head copies of q, k and v
// (graph::fused_attention says which runs).
double saved_extra_bytes(const graph::Graph& g, const graph::Op& op, bool on_gpu) {
  const std::string& type = op.type();
  if ((type != "attention" && type != "gqa_attention" && type != "shared_kv_attention" &&
       type != "ring_attention_step") ||
      op.inputs.size() < 3)
    return 0;
  const Shape q = op.inputs[0].shape(), k = op.inputs[1].shape();
  const int64_t d = op.attrs().get_or<int64_t>("d", 0);
  if (q.size() != 3 || k.size() != 3 || d <= 0) return 0;
  const double heads = static_cast<double>(q[2] / d);
  const double queries = static_cast<double>(q[0]) * heads * static_cast<double>(q[1]);
  const DType dtype = g.tensor(op.inputs[0].tensor).dtype;
  // A ring attention step (runtime/attention_tiles.h) keeps float32 copies of its operands
  // in the heads' layout, its output and each query's log-sum-exp; its probabilities exist a
  // tile at a time.
  if (type == "ring_attention_step")
    return 4 * (queries + 2 * static_cast<double>(numel(q)) + 2 * static_cast<double>(numel(k)));
  if (graph::fused_attention(dtype == DType::kBFloat16, on_gpu))
    return 4 * queries + static_cast<double>(numel(q) * size_bytes(dtype));
  return 4 * (queries * static_cast<double>(k[1]) + 3 * static_cast<double>(numel(q)));
}

}  // namespace

double all_reduce_seconds(const CostModel& cost, const std::vector<DeviceId>& devices,
                          double bytes) {
  const double k = static_cast<double>(devices.size());
  if (k < 2) return 0;
  bool inter = false;
  for (DeviceId d : devices)
    inter =
        inter || d.value() / cost.devices_per_node != devices[0].value() / cost.devices_per_node;
  const CostModel::Link within = cost.intra_link("all_reduce");
  const double alpha = inter ? cost.inter_alpha_s : within.alpha_s;
  const double beta = inter ? cost.inter_beta_s_per_byte : within.beta_s_per_byte;
  // lower's formula, the one loom calibrate fits.
  return lower::rule_of(lower::Primitive::kAllReduce)
      .cost(static_cast<int64_t>(devices.size()), bytes, alpha, beta);
}

namespace {

// Under parallel.zero 1, what a rank's shared pieces come to: the elements it owns (and keeps
// optimizer state for) of those it holds, and its segments of the reduced gradients, from the
// same bucketing as the runtime's (lower/grad_bucketing.h).
struct ZeroShare {
  double shared = 0, owned = 0, segments = 0;
};
// A rank's gradient groups as the runtime forms them (lower/grad_bucketing.h): each group's
// ranks and the element counts of its pieces, in the executor's order.
struct GradGroups {
  std::vector<std::vector<DeviceId>> devices;
  std::vector<std::vector<int64_t>> numels;
};
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

int64_t bucket_bytes(const Config& config) {
  return static_cast<int64_t>(config.comm.bucket_mb * 1024 * 1024);
}

ZeroShare zero_share(const Config& config, const lower::Lowered& lowered, size_t rank) {
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
         lower::plan_buckets(numels[k], 4, bucket_bytes(config), members, /*zero1=*/true)) {
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

// Whether collectives run as gloo's: a reduce-scatter is an all-to-all into a buffer of the
// input's size, then a local sum; an all-gather an all-to-all from a buffer of the output's size
// (comm/gloo_comm.cc). Either holds a copy as large as its larger side.
bool gloo_reduce_scatter(const Config& config) {
  return config.comm.backend == "gloo" || config.comm.backend == "local" ||
         (config.comm.backend == "auto" && config.run.device == "cpu");
}

bool on_gpu(const Config& config) { return config.run.device == "cuda"; }

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

// parallel.zero 3: what gathered parameter pieces cost rank `r` at their largest, walking its
// segments in item order (runtime/param_gather.cc). In a forward, next to the activations:
// a piece in use while the next one is gathered (gloo's all-to-all sends from a buffer of the
// gathered size). In a backward, when the activations of the layers before are what is left: a
// piece's gradient being reduce-scattered (gloo: an all-to-all's buffers besides it) while the
// previous linear's weight is gathered.
std::pair<double, double> gather_costs(const Config& config, const graph::Graph& planned,
                                       const lower::Lowered& lowered, size_t r) {
  const double copies = gloo_reduce_scatter(config) ? 2 : 1;
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

namespace {

// `c`: the plan's compute_cost (its recomputed regions, fused ops and, when kept, its
// lowered_bytes).
Holdings holdings(const Config& config, const graph::Graph& planned, const lower::Lowered& lowered,
                  int64_t world, const ComputeCost& c) {
  const RecomputeCost& rc = c.recompute;
  const size_t n = static_cast<size_t>(world);
  Holdings h;
  for (auto* v : {&h.recompute_bytes, &h.state_params, &h.zero_segments, &h.zero_receive,
                  &h.gather_forward, &h.gather_backward})
    v->assign(n, 0);
  {
    LoweredBytes found;
    if (!c.bytes) found = lowered_bytes(planned, lowered, c.fusion, on_gpu(config));
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
    std::tie(h.gather_forward[r], h.gather_backward[r]) = gather_costs(config, planned, lowered, r);
  // Optimizer state: every held element, or under ZeRO-1 only the owned shared ones.
  h.state_params = h.params;
  h.zero_segments.assign(n, 0);
  if (config.parallel.zero == 1)
    for (size_t r = 0; r < n; ++r) {
      const ZeroShare z = zero_share(config, lowered, r);
      h.state_params[r] = h.params[r] - z.shared + z.owned;
      // The summed segments are written inside the buckets, but for MPI (grad_buckets.cc).
      h.zero_segments[r] = config.comm.backend == "mpi" ? z.segments : 0.0;
      h.zero_receive[r] = gloo_reduce_scatter(config) ? z.shared : 0.0;
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
double pipeline_extra_micro_batches(const Config& config) {
  return config.parallel.pp > 1 ? 0.5 : 0.0;
}

RankMemory memory_of(const Config& config, const Holdings& h, size_t r) {
  RankMemory m;
  m.activation_bytes = h.acts[r];
  const TrainingStateBytes state = training_state_bytes(config.optimizer);
  // A ZeRO-1 rank's reduced gradient segments are float32 gradients too.
  m.held_bytes = h.params[r] * (state.weight + state.grad) + h.state_params[r] * state.optimizer +
                 h.zero_segments[r] * state.grad +
                 pipeline_extra_micro_batches(config) * h.acts[r] +
                 std::max(h.incoming[r] + backward_transient(h, r), h.gather_forward[r]);
  return m;
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

std::vector<RankMemory> rank_memory(const Config& config, const graph::Graph& planned,
                                    const lower::Lowered& lowered, const ComputeCost* compute) {
  const int64_t world = static_cast<int64_t>(lowered.programs.size());
  // Only the bytes are read, which no cost model changes.
  std::optional<ComputeCost> computed;
  if (!compute)
    computed = compute_cost(planned, lowered, CostModel::builtin(), on_gpu(config),
                            planner::graph_flops(planned));
  const ComputeCost& c = compute ? *compute : *computed;
  const Holdings h = holdings(config, planned, lowered, world, c);
  std::vector<RankMemory> out;
  for (size_t r = 0; r < static_cast<size_t>(world); ++r) out.push_back(memory_of(config, h, r));
  return out;
}

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

namespace {

// By tensor id: the share of a mixture of experts' slots buffer a balanced router fills (the
// expert ops' `rows` of its c slots), what a ragged all-to-all sends of it
// (runtime/path_runner.h); 1 for every other tensor.
std::vector<double> slot_fill(const graph::Graph& planned) {
  std::vector<double> fill(planned.tensors().size(), 1.0);
  for (const auto& op : planned.ops()) {
    if ((op.type() != graph::kMoeDispatch && op.type() != graph::kExpertLinear) ||
        !op.attrs().has("rows"))
      continue;
    const auto out = static_cast<size_t>(op.outputs[0].tensor.value());
    const double slots = static_cast<double>(planned.tensor(op.outputs[0].tensor).shape[2]);
    fill[out] = std::min(1.0, static_cast<double>(op.attrs().get<int64_t>("rows")) / slots);
  }
  return fill;
}

// Every rank's share of a communication path at once: what path_seconds and add_path_bytes give
// each rank, in O(the path's devices) rather than O(world) per rank (a plan of a thousand ranks
// has thousands of adapters, each path on a few of them). Each rank's figures are summed in the
// same order as those functions sum them, so they are the same numbers.
class PathShares {
 public:
  explicit PathShares(size_t world)
      : seconds_(world, 0),
        bytes_(world, 0),
        piece_(world, 0),
        seen_(world, 0),
        listed_(world, 0) {}

  // path_seconds(path, r, fill) of every rank r: seconds(r), nonzero only for ranks().
  void time(const lower::CommPath& path, double fill) {
    for (size_t r : ranks_) seconds_[r] = 0;
    ranks_.clear();
    ++path_mark_;
    for (const lower::CommStep& st : path.steps) {
      ++step_mark_;
      const double c = st.cost_s * (lower::rule_of(st.primitive).ragged ? fill : 1.0);
      for (const auto* layout : {&st.before, &st.after})
        for (DeviceId d : layout->devices) {
          const auto r = static_cast<size_t>(d.value());
          if (seen_[r] == step_mark_) continue;
          seen_[r] = step_mark_;
          if (listed_[r] != path_mark_) listed_[r] = path_mark_, ranks_.push_back(r);
          seconds_[r] += c;
        }
    }
  }
  const std::vector<size_t>& ranks() const { return ranks_; }
  bool has(size_t r) const { return listed_[r] == path_mark_; }
  double seconds(size_t r) const { return seconds_[r]; }

  // add_path_bytes(path, shape, elem, r, times, ranks[r].sent, fill) for every rank r.
  void add_bytes(const lower::CommPath& path, const Shape& shape, int64_t elem, double times,
                 double fill, std::vector<RankEstimate>& ranks) {
    std::vector<size_t> senders;
    for (const lower::CommStep& st : path.steps) {
      ++step_mark_;
      senders.clear();
      // Each rank of the layout before the step, at its last position (add_path_bytes').
      for (size_t p = st.before.devices.size(); p-- > 0;) {
        const auto r = static_cast<size_t>(st.before.devices[p].value());
        if (seen_[r] == step_mark_) continue;
        seen_[r] = step_mark_;
        piece_[r] = static_cast<double>(
            numel(st.before.piece(static_cast<int64_t>(p), TensorId(0), shape).shape()) * elem);
        bytes_[r] = 0;
        senders.push_back(r);
      }
      const lower::PrimitiveRule& rule = lower::rule_of(st.primitive);
      for (const std::vector<DeviceId>& g : st.groups) {     // lower::bytes_sent, group by group
        if (rule.kind == lower::PrimitiveKind::kTransfer) {  // pairs {from, to}
          const auto r = static_cast<size_t>(g[0].value());
          if (seen_[r] == step_mark_ && g[1] != g[0]) bytes_[r] += rule.bytes(2, piece_[r]);
          continue;
        }
        for (DeviceId d : g) {
          const auto r = static_cast<size_t>(d.value());
          if (seen_[r] == step_mark_)
            bytes_[r] += rule.bytes(static_cast<int64_t>(g.size()), piece_[r]);
        }
      }
      for (size_t r : senders) {
        const double bytes = bytes_[r] * (rule.ragged ? fill : 1.0);
        if (bytes > 0) ranks[r].sent[rule.name] += bytes * times;
      }
    }
  }

 private:
  std::vector<double> seconds_, bytes_, piece_;
  std::vector<uint64_t> seen_;    // == step_mark_: met in the current step
  std::vector<uint64_t> listed_;  // == path_mark_: in ranks_
  std::vector<size_t> ranks_;
  uint64_t step_mark_ = 0, path_mark_ = 0;
};

// Every rank's communication per step through the adapters: each adapter's forward and
// gradient paths per micro-batch (the steps a rank takes part in), and a weight gathered again
// for its backward. `fill`: slot_fill's.
void add_adapter_communication(const graph::Graph& planned, const lower::Lowered& lowered, double m,
                               const std::vector<double>& fill, std::vector<RankEstimate>& ranks) {
  PathShares forward(ranks.size()), backward(ranks.size());
  for (const auto& a : lowered.adapters) {
    const double f = fill[static_cast<size_t>(a.tensor.value())];
    forward.time(a.forward, f);
    backward.time(a.backward, f);
    for (size_t r : forward.ranks())
      ranks[r].comm_s += m * (forward.seconds(r) + backward.seconds(r));
    for (size_t r : backward.ranks())
      if (!forward.has(r)) ranks[r].comm_s += m * (forward.seconds(r) + backward.seconds(r));
    const auto& t = planned.tensor(a.tensor);
    forward.add_bytes(a.forward, t.shape, size_bytes(t.dtype), m, f, ranks);
    forward.add_bytes(a.backward, t.shape, size_bytes(t.dtype), m, f, ranks);
    if (!a.regather) continue;  // a linear's weight is gathered again for its backward
    forward.time(a.forward, 1.0);
    for (size_t r : forward.ranks()) ranks[r].comm_s += m * forward.seconds(r);
    forward.add_bytes(a.forward, t.shape, size_bytes(t.dtype), m, 1.0, ranks);
  }
}

// A rank's gradient all-reduces, once per step: one per bucket of the runtime's (a latency per
// bucket, not per tensor).
void add_grad_sync(const Config& config, const lower::Lowered& lowered, const CostModel& cost,
                   size_t r, RankEstimate& re) {
  const GradGroups groups = grad_groups(lowered, r);
  for (size_t k = 0; k < groups.devices.size(); ++k) {
    const auto members = static_cast<int64_t>(groups.devices[k].size());
    for (const lower::BucketPlan& b :
         lower::plan_buckets(groups.numels[k], 4, bucket_bytes(config), members, false)) {
      const double bytes = static_cast<double>(b.elements * 4);
      re.comm_s += all_reduce_seconds(cost, groups.devices[k], bytes);
      re.sent["grad all_reduce"] +=
          lower::rule_of(lower::Primitive::kAllReduce).bytes(members, bytes);
    }
  }
}

// A rank's memory with `in_flight` micro-batches of activations held at once. Activations (and
// a pipeline backward's extra, pipeline_extra_micro_batches), gradient buckets (reduced after the
// last backward, when activations are gone) and the optimizer's temporaries come one after the
// other; the backward also holds a parameter's incoming gradients before they are accumulated.
// memory_of splits the same figures for the schedule search.
void add_memory(const Config& config, const Holdings& h, size_t r, double in_flight,
                RankEstimate& re) {
  // The optimizer's step makes temporaries the size of the piece it updates: AdamW's sqrt and
  // denominator, SGD's decayed gradient.
  const bool adamw = config.optimizer.type == "adamw";
  const double opt_temporaries = adamw ? 2 : config.optimizer.weight_decay != 0 ? 1 : 0;
  const TrainingStateBytes state = training_state_bytes(config.optimizer);
  const RankMemory mem = memory_of(config, h, r);
  re.micro_batches_in_flight = in_flight + pipeline_extra_micro_batches(config);
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

Estimate estimate_plan(const Config& config, const graph::Graph& planned,
                       const lower::Lowered& lowered, const CostModel& cost,
                       const PipelineTimes& pipeline, const ComputeCost* compute) {
  const auto& par = config.parallel;
  const int64_t world = static_cast<int64_t>(lowered.programs.size());
  const size_t n = static_cast<size_t>(world);
  const double m = static_cast<double>(config.micro_batches());
  const int64_t ranks_per_stage = par.ranks_per_stage();
  // One pass over the recomputed regions gives their seconds on `cost` and, on the run's
  // device, their bytes.
  std::optional<ComputeCost> computed;
  if (!compute)
    computed = compute_cost(planned, lowered, cost, on_gpu(config), planner::graph_flops(planned));
  const std::vector<double>& fwd = compute ? compute->forward_s : computed->forward_s;
  const RecomputeCost& rc = compute ? compute->recompute : computed->recompute;
  const std::vector<double>& refwd = rc.forward_s;
  const Holdings h = holdings(config, planned, lowered, world, compute ? *compute : *computed);
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
  add_adapter_communication(planned, lowered, m, slot_fill(planned), e.ranks);
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
    add_grad_sync(config, lowered, cost, r, re);
    re.step_s = re.compute_s + re.comm_s;

    const double in_flight = pipelined && stage < pipeline.peak_micro_batches.size()
                                 ? pipeline.peak_micro_batches[stage]
                                 : flat_units;
    add_memory(config, h, r, in_flight, re);
    e.step_s = std::max(e.step_s, re.step_s);
  }
  return e;
}

double path_seconds(const lower::CommPath& path, int64_t rank, double all_to_all_fill) {
  double t = 0;
  for (const lower::CommStep& st : path.steps) {
    bool in = false;
    for (const auto& layout : {&st.before, &st.after})
      for (DeviceId d : layout->devices) in = in || d.value() == rank;
    if (in) t += st.cost_s * (lower::rule_of(st.primitive).ragged ? all_to_all_fill : 1.0);
  }
  return t;
}

void add_path_bytes(const lower::CommPath& path, const Shape& shape, int64_t elem, int64_t rank,
                    double times, std::map<std::string, double>& out, double all_to_all_fill) {
  for (const lower::CommStep& st : path.steps) {
    int64_t pos = -1;
    for (size_t p = 0; p < st.before.devices.size(); ++p)
      if (st.before.devices[p].value() == rank) pos = static_cast<int64_t>(p);
    if (pos < 0) continue;
    const double piece =
        static_cast<double>(numel(st.before.piece(pos, TensorId(0), shape).shape()) * elem);
    const lower::PrimitiveRule& rule = lower::rule_of(st.primitive);
    const double bytes = lower::bytes_sent(st, rank, piece) * (rule.ragged ? all_to_all_fill : 1.0);
    if (bytes > 0) out[rule.name] += bytes * times;
  }
}
}  // namespace loom::plan
