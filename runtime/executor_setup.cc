// Executor::create: resolving this rank's program once, before any step: its parameter pieces,
// where every op input comes from, which ops run fused, the communicators of its paths and the
// gradient buckets. Running a step is executor.cc.
#include <ATen/ATen.h>

#include <map>
#include <set>

#include "graph/ops_moe.h"
#include "lower/fusion.h"
#include "lower/param_shards.h"
#include "runtime/executor.h"
#include "runtime/executor_impl.h"
#include "runtime/grad_buckets.h"
#include "runtime/init.h"

namespace loom::runtime {

using lower::Adapter;
using lower::CommPath;

namespace {

using Source = Executor::Impl::Source;
using ForwardStep = Executor::Impl::ForwardStep;

// Materialises this rank's parameter pieces (one per (tensor, slice), shared by the ops that
// read it) and returns each op input's parameter slot (-1: not a parameter), per op.
std::vector<std::vector<int64_t>> add_parameters(Executor::Impl& s, uint64_t seed,
                                                 bool seeded_init) {
  std::map<std::pair<int64_t, std::string>, int64_t> holders;
  for (const auto& sync : s.lowered.grad_syncs)
    holders[{sync.tensor.value(), sync.piece.ranges_string()}] =
        static_cast<int64_t>(sync.devices.size());
  // parallel.zero 3: a parameter read through a parameter adapter is stored as its shard.
  const auto stored = lower::parameter_adapters(s.lowered);
  std::vector<std::vector<int64_t>> slots(s.graph.ops().size());
  for (size_t i = 0; i < s.graph.ops().size(); ++i) {
    const graph::Op& op = s.graph.ops()[i];
    if (op.device.value() != s.rank) continue;
    for (const auto& read : op.inputs) {
      const graph::FullTensor& t = s.graph.tensor(read.tensor);
      slots[i].push_back(-1);
      if (t.role != graph::TensorRole::kParameter) continue;
      graph::SubTensor in = read;
      const auto shard = stored.find({t.id.value(), op.def->name});
      if (shard != stored.end()) in = lower::stored_piece(*shard->second, op.device, t.shape);
      auto key = std::make_pair(t.id.value(), in.ranges_string());
      if (auto it = s.param_index.find(key); it != s.param_index.end()) {
        slots[i].back() = static_cast<int64_t>(it->second);
        if (shard != stored.end()) s.shard_slot[shard->second->id] = slots[i].back();
        continue;
      }
      slots[i].back() = static_cast<int64_t>(s.params.size());
      if (shard != stored.end()) s.shard_slot[shard->second->id] = slots[i].back();
      at::Tensor p = seeded_init
                         ? init_parameter_piece(t, in, seed).to(s.device.device)
                         : at::zeros(in.shape(),
                                     at::TensorOptions().dtype(at::kFloat).device(s.device.device));
      p.set_requires_grad(true);
      s.param_index[key] = s.params.size();
      s.params.push_back(p);
      s.pieces.push_back(in);
      auto h = holders.find(key);
      s.replicas.push_back(h == holders.end() ? 1 : h->second);
    }
  }
  return slots;
}

// The buckets of the parameter pieces this rank shares with others (grad_buckets.h). A piece's
// gradient is final after as many accumulations as there are backward (or input-gradient)
// blocks of the stages that read it on this rank through autograd, plus the weight-gradient
// blocks of the stages whose linears defer its gradient to them.
void add_grad_buckets(Executor::Impl& s, const std::vector<std::vector<int64_t>>& param_slots,
                      std::map<std::vector<int64_t>, std::shared_ptr<comm::Comm>> groups,
                      int64_t bucket_bytes, bool zero1) {
  const lower::Program& prog = s.lowered.programs[static_cast<size_t>(s.rank)];
  if (prog.grad_syncs.empty()) return;
  std::map<int64_t, int64_t> backward_blocks, weight_blocks;  // stage -> its blocks
  for (const auto& block : prog.blocks) {
    if (lower::runs_backward_pass(block.kind)) ++backward_blocks[block.stage.value()];
    if (block.kind == lower::BlockKind::kW) ++weight_blocks[block.stage.value()];
  }
  std::set<std::pair<size_t, int64_t>> deferred_reads;  // (op, input) reads left to W
  for (const auto& steps : s.forward_steps)
    for (const ForwardStep& step : steps)
      if (step.deferred) deferred_reads.insert({step.op, 1});
  std::vector<std::set<int64_t>> stages(s.params.size());     // stages reading it via autograd
  std::vector<std::set<int64_t>> deferring(s.params.size());  // stages deferring it to W
  for (size_t i = 0; i < param_slots.size(); ++i)
    for (size_t k = 0; k < param_slots[i].size(); ++k) {
      const int64_t slot = param_slots[i][k];
      if (slot < 0) continue;
      auto& to = deferred_reads.count({i, static_cast<int64_t>(k)}) ? deferring : stages;
      to[static_cast<size_t>(slot)].insert(s.graph.ops()[i].stage.value());
    }
  // In the order of the plan's gradient syncs (about the order the forward uses them), the same
  // on every rank: members of a group lay out their buckets alike.
  std::vector<std::pair<int64_t, GradBuckets::Param>> shared;
  for (int64_t id : prog.grad_syncs) {
    const auto& sync = s.lowered.grad_syncs[static_cast<size_t>(id)];
    const size_t index = s.param_index.at({sync.tensor.value(), sync.piece.ranges_string()});
    GradBuckets::Param p{s.params[index], sync.devices, 0};
    for (int64_t stage : stages[index]) p.accumulations += backward_blocks[stage];
    for (int64_t stage : deferring[index]) p.accumulations += weight_blocks[stage];
    shared.emplace_back(id, std::move(p));
  }
  std::sort(shared.begin(), shared.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<GradBuckets::Param> params;
  for (auto& [id, p] : shared) params.push_back(std::move(p));
  s.buckets =
      std::make_unique<GradBuckets>(std::move(params), std::move(groups), bucket_bytes, zero1);
}

// Where an op's input comes from, on this rank.
struct SourceOf {
  const Executor::Impl& s;
  const std::vector<std::vector<int64_t>>& param_slots;
  std::map<std::pair<int64_t, std::string>, int64_t> adapter_of;  // (tensor, consumer) -> id

  SourceOf(const Executor::Impl& impl, const std::vector<std::vector<int64_t>>& slots)
      : s(impl), param_slots(slots) {
    for (const Adapter& a : s.lowered.adapters)
      for (const std::string& consumer : a.consumers)
        adapter_of[{a.tensor.value(), consumer}] = a.id;
  }
  Source operator()(const graph::Op& op, size_t op_index, size_t k) const {
    const graph::FullTensor& t = s.graph.tensor(op.inputs[k].tensor);
    if (t.role == graph::TensorRole::kInput) return {Source::Kind::kInput, t.id.value()};
    // An activation moved by an adapter, or a parameter gathered from its shards (zero 3).
    if (auto a = adapter_of.find({t.id.value(), op.def->name}); a != adapter_of.end())
      return {Source::Kind::kAdapter, a->second};
    if (t.role == graph::TensorRole::kParameter)
      return {Source::Kind::kParameter, param_slots[op_index][k]};
    const int64_t made_in = s.stage_of(t.id.value());
    return {made_in == op.stage.value() ? Source::Kind::kSameStage : Source::Kind::kStageLeaf,
            t.id.value()};
  }
};

// The step of op item `i` of `seg`: its kernel and sources, a linear's weight deferred to the W
// block or gathered again, a linear fused with its bias_add (then item i + 1 is taken too).
Status op_step(const Executor::Impl& s, const KernelRegistry& kernels, const SourceOf& source,
               const lower::Segment& seg, size_t& i, bool split_stage,
               const std::vector<bool>& fused, ForwardStep& step) {
  const auto& ops = s.graph.ops();
  step.op = static_cast<size_t>(seg.items[i].index);
  const graph::Op& op = ops[step.op];
  step.kernel = kernels.find(op.type());
  if (!step.kernel)
    return Error::at(op.name(),
                     "no kernel registered for op type '" + op.type() + "' (op " + op.name() + ")");
  for (size_t k = 0; k < op.inputs.size(); ++k) step.sources.push_back(source(op, step.op, k));
  step.reads = op.inputs;
  step.linear = op.def->weight_product && step.sources.size() == 2;
  step.deferred = split_stage && step.linear && step.sources[1].kind == Source::Kind::kParameter;
  if (step.linear && step.sources[1].kind == Source::Kind::kAdapter &&
      s.lowered.adapters[static_cast<size_t>(step.sources[1].index)].regather) {
    step.gathered = step.sources[1].index;
    step.sources[1] = {Source::Kind::kParameter, s.shard_slot.at(step.gathered)};
  }
  if (fused[step.op]) {  // lower/fusion.h: the next item is its bias_add
    step.fused_bias = seg.items[i + 1].index;
    step.bias =
        source(ops[static_cast<size_t>(step.fused_bias)], static_cast<size_t>(step.fused_bias), 1);
    ++i;
  }
  return Status::success();
}

// The step of a fused loss chain (lower/fusion.h): LibTorch's cross-entropy on the chain's
// logits and targets, with the nll's normalizer, making the nll's output. Its four items are
// one step.
void loss_step(const Executor::Impl& s, const Kernel& cross_entropy, const SourceOf& source,
               const lower::FusedLoss& chain, size_t& i, ForwardStep& step) {
  const auto& ops = s.graph.ops();
  const auto group_lse = static_cast<size_t>(chain.group_lse);
  const auto pick = static_cast<size_t>(chain.pick);
  step.op = static_cast<size_t>(chain.nll);
  step.kernel = &cross_entropy;
  step.sources = {source(ops[group_lse], group_lse, 0), source(ops[pick], pick, 1)};
  step.reads = {ops[group_lse].inputs[0], ops[pick].inputs[1]};
  i += 3;
}

// What a step hands on: its outputs' dtypes, whether it makes the loss, an auxiliary loss's
// weight in the step's metric.
void finish_step(const Executor::Impl& s, ForwardStep& step) {
  const auto& ops = s.graph.ops();
  const graph::Op& last =
      ops[step.fused_bias >= 0 ? static_cast<size_t>(step.fused_bias) : step.op];
  for (const auto& out : last.outputs)
    step.out_dtypes.push_back(s.dtype[static_cast<size_t>(out.tensor.value())]);
  step.makes_loss = s.graph.tensor(last.outputs[0].tensor).role == graph::TensorRole::kLoss;
  if (last.type() == graph::kMoeAuxLoss) {
    int64_t holders = 0;
    for (const graph::Op& other : ops)
      holders += other.type() == graph::kMoeAuxLoss && other.outputs[0] == last.outputs[0];
    step.metric_weight = 1.0 / static_cast<double>(holders);
  }
}

// Resolves, once, where every input of every op of this rank's forward blocks comes from, and
// which ops run fused (lower/fusion.h).
Status plan_forward_steps(Executor::Impl& s, const KernelRegistry& kernels,
                          const std::vector<std::vector<int64_t>>& param_slots) {
  const SourceOf source(s, param_slots);
  const std::vector<bool> fused = lower::fused_into_next(s.graph, s.lowered);
  // Fused loss chains by their first op; a registry without the cross-entropy kernel runs them
  // apart.
  const Kernel* cross_entropy = kernels.find("cross_entropy");
  std::map<int64_t, lower::FusedLoss> loss_chains;
  if (cross_entropy)
    for (const lower::FusedLoss& c : lower::fused_losses(s.graph, s.lowered))
      loss_chains[c.first] = c;
  const lower::Program& prog = s.lowered.programs[static_cast<size_t>(s.rank)];
  std::set<int64_t> split_stages;  // stages with weight-gradient blocks
  for (const lower::ProgramBlock& b : prog.blocks)
    if (b.kind == lower::BlockKind::kW) split_stages.insert(b.stage.value());
  s.forward_steps.resize(prog.segments.size());
  for (size_t g = 0; g < prog.segments.size(); ++g) {
    const lower::Segment& seg = prog.segments[g];
    s.segment_of_stage[seg.stage.value()] = g;
    int64_t last_gather = -1, last_regather = -1;  // the segment's previous parameter adapters
    for (size_t i = 0; i < seg.items.size(); ++i) {
      const lower::SegmentItem& item = seg.items[i];
      ForwardStep step;
      step.item = static_cast<int64_t>(i);
      if (item.kind == lower::SegmentItem::Kind::kAdapter) {
        const Adapter& a = s.lowered.adapters[static_cast<size_t>(item.index)];
        if (a.parameter) {
          if (last_gather >= 0) s.next_gather[last_gather] = a.id;
          last_gather = a.id;
        }
        if (a.regather) {
          if (last_regather >= 0) s.previous_regather[a.id] = last_regather;
          last_regather = a.id;
        }
        step.adapter = &item;
        s.forward_steps[g].push_back(std::move(step));
        continue;
      }
      if (auto c = loss_chains.find(item.index); c != loss_chains.end()) {
        loss_step(s, *cross_entropy, source, c->second, i, step);
      } else {
        LOOM_TRY(op_step(s, kernels, source, seg, i, split_stages.count(seg.stage.value()) > 0,
                         fused, step));
      }
      finish_step(s, step);
      s.forward_steps[g].push_back(std::move(step));
    }
  }
  return Status::success();
}

}  // namespace

Result<std::unique_ptr<Executor>> Executor::create(const graph::Graph& planned,
                                                   const lower::Lowered& lowered,
                                                   std::shared_ptr<comm::Comm> world,
                                                   const KernelRegistry& kernels,
                                                   const ExecutorOptions& options) {
  const RunDevice& device = options.device;
  auto impl = std::make_unique<Impl>();
  impl->graph = planned;
  impl->lowered = lowered;
  impl->world = world;
  impl->device = device;
  impl->rank = world->world_rank().value();
  for (const auto& t : planned.tensors()) impl->dtype.push_back(scalar_type(t.dtype));
  impl->ragged_dim.assign(planned.tensors().size(), -1);
  for (const graph::Op& op : planned.ops())
    if (op.type() == graph::kMoeDispatch || op.type() == graph::kExpertLinear)
      impl->ragged_dim[static_cast<size_t>(op.outputs[0].tensor.value())] = 2;
  if (static_cast<int64_t>(lowered.programs.size()) != world->size())
    return Error::at("comm", "the plan is for " + std::to_string(lowered.programs.size()) +
                                 " ranks but the world has " + std::to_string(world->size()));
  // Every group any step or gradient sync uses, created in the same order on every rank.
  impl->runner = std::make_unique<PathRunner>(world, device.device);
  std::vector<const CommPath*> paths;
  for (const Adapter& a : impl->lowered.adapters) {
    paths.push_back(&a.forward);
    paths.push_back(&a.backward);
  }
  LOOM_TRY(impl->runner->add_groups(paths));
  // Gradient buckets reduce on communicators of their own: their all-reduces start inside
  // backward, and must not take turns with the adapters' collectives on a shared one.
  std::map<std::vector<int64_t>, std::shared_ptr<comm::Comm>> grad_groups;
  for (const auto& sync : impl->lowered.grad_syncs) {
    std::vector<int64_t> key;
    std::vector<Rank> ranks;
    for (DeviceId d : sync.devices) {
      key.push_back(d.value());
      ranks.push_back(Rank(d.value()));
    }
    if (ranks.size() < 2 || grad_groups.count(key)) continue;
    LOOM_ASSIGN_OR_RETURN(grad_groups[key], world->new_group(ranks, "grad"));
  }
  impl->producer_stage.assign(planned.tensors().size(), -1);
  for (const graph::Op& op : planned.ops()) {
    if (op.device.value() != impl->rank) continue;
    for (const auto& o : op.outputs)
      impl->producer_stage[static_cast<size_t>(o.tensor.value())] = op.stage.value();
    for (const auto& in : op.inputs) impl->consumed[op.stage.value()].insert(in.tensor.value());
  }
  const auto param_slots = add_parameters(*impl, options.seed, options.seeded_init);
  LOOM_TRY(plan_forward_steps(*impl, kernels, param_slots));
  plan_regions(*impl);
  add_grad_buckets(*impl, param_slots, std::move(grad_groups), options.bucket_bytes, options.zero1);
  return std::unique_ptr<Executor>(new Executor(std::move(impl)));
}

}  // namespace loom::runtime
