#include "exec/runtime/rank_executor.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <map>
#include <set>
#include <stdexcept>

#include "exec/runtime/init.h"
#include "exec/runtime/oracle.h"
#include "exec/runtime/path_runner.h"

namespace loom::runtime {
namespace {

using lower::Adapter;
using lower::CommPath;
using lower::CommStep;
using lower::Primitive;

using Part = PathPart;

// Thrown inside autograd functions, caught by RankExecutor::run.
struct CommFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(const Status& s) {
  if (!s.ok()) throw CommFailure(s.error().message);
}

}  // namespace

struct RankExecutor::Impl {
  graph::Graph graph;
  lower::Lowered lowered;
  std::shared_ptr<comm::Comm> world;
  const KernelRegistry* kernels = nullptr;
  int64_t rank = 0;
  std::unique_ptr<PathRunner> runner;
  std::vector<at::Tensor> params;
  std::vector<graph::SubTensor> pieces;
  std::vector<int64_t> replicas;
  std::map<std::pair<int64_t, std::string>, size_t> param_index;  // (tensor, ranges) -> index
  std::vector<std::vector<int64_t>> op_params;  // per op, per input: its parameter slot or -1
  std::map<std::pair<int64_t, std::string>, int64_t> adapter_of;  // (tensor, consumer) -> adapter
  std::map<int64_t, StageId> producer_stage;                      // tensors made on this rank
  std::map<int64_t, std::set<int64_t>> consumed;                  // stage -> tensors its ops read

  // Per micro-batch values.
  struct Micro {
    std::unordered_map<int64_t, at::Tensor> env;      // outputs of this rank's ops
    std::unordered_map<int64_t, at::Tensor> adapted;  // adapter id -> value consumers read
    std::unordered_map<int64_t, at::Tensor> sent;     // adapter id -> what the producers sent
    std::unordered_map<int64_t, at::Tensor> leaves;   // tensor id -> same-rank stage boundary
    std::map<int64_t, std::map<int64_t, std::pair<at::Tensor, at::Tensor>>>
        pending;  // stage -> tensor -> (value, grad)
    at::Tensor loss;
    TensorId loss_tensor;  // which loss (Chimera's pipelines each have their own)
  };
  std::vector<Micro> micro;

  // Runs a path; a failure inside autograd functions travels as CommFailure.
  at::Tensor run_path(const CommPath& path, const Shape& full, at::Tensor x, Part part,
                      int64_t tag_base) {
    auto r = runner->run(path, full, std::move(x), part, tag_base);
    if (!r.ok()) throw CommFailure(r.error().message);
    return *r;
  }

  int64_t tag(const Adapter& a, int direction, int64_t mb) const {
    LOOM_CHECK(mb < lower::kMaxMicroBatches)
        << "micro-batch " << mb << " past the lowering's limit";
    return lower::message_tag(a.id, direction == 0, mb);
  }

  const Shape& shape_of(TensorId t) const { return graph.tensor(t).shape; }
};

namespace {

// An adapter within a stage: forward path as the function, gradient path as its backward.
struct AdapterFn : public torch::autograd::Function<AdapterFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::Tensor x,
                                                int64_t impl, int64_t adapter, int64_t mb) {
    ctx->saved_data["impl"] = impl;
    ctx->saved_data["adapter"] = adapter;
    ctx->saved_data["mb"] = mb;
    auto* self = reinterpret_cast<RankExecutor::Impl*>(impl);
    const Adapter& a = self->lowered.adapters[static_cast<size_t>(adapter)];
    return {
        self->run_path(a.forward, self->shape_of(a.tensor), x, Part::kAll, self->tag(a, 0, mb))};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* self = reinterpret_cast<RankExecutor::Impl*>(ctx->saved_data["impl"].toInt());
    const Adapter& a =
        self->lowered.adapters[static_cast<size_t>(ctx->saved_data["adapter"].toInt())];
    at::Tensor g = self->run_path(a.backward, self->shape_of(a.tensor), grads[0], Part::kAll,
                                  self->tag(a, 1, ctx->saved_data["mb"].toInt()));
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

RankExecutor::RankExecutor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RankExecutor::~RankExecutor() = default;

Result<std::unique_ptr<RankExecutor>> RankExecutor::create(const graph::Graph& planned,
                                                           const lower::Lowered& lowered,
                                                           std::shared_ptr<comm::Comm> world,
                                                           const KernelRegistry& kernels,
                                                           uint64_t seed) {
  auto impl = std::make_unique<Impl>();
  impl->graph = planned;
  impl->lowered = lowered;
  impl->world = world;
  impl->kernels = &kernels;
  impl->rank = world->world_rank().value();
  if (static_cast<int64_t>(lowered.programs.size()) != world->size())
    return Error::at("comm", "the plan is for " + std::to_string(lowered.programs.size()) +
                                 " ranks but the world has " + std::to_string(world->size()));
  // Every group any step or gradient sync uses, created in the same order on every rank.
  impl->runner = std::make_unique<PathRunner>(world);
  std::vector<const CommPath*> paths;
  for (const Adapter& a : impl->lowered.adapters) {
    paths.push_back(&a.forward);
    paths.push_back(&a.backward);
  }
  std::vector<std::vector<DeviceId>> syncs;
  for (const auto& s : impl->lowered.grad_syncs) syncs.push_back(s.devices);
  LOOM_TRY(impl->runner->add_groups(paths, syncs));
  for (const Adapter& a : lowered.adapters)
    for (const std::string& consumer : a.consumers)
      impl->adapter_of[{a.tensor.value(), consumer}] = a.id;
  std::map<std::pair<int64_t, std::string>, int64_t> holders;
  for (const auto& s : lowered.grad_syncs)
    holders[{s.tensor.value(), s.piece.ranges_string()}] = static_cast<int64_t>(s.devices.size());
  impl->op_params.resize(planned.ops().size());
  for (size_t i = 0; i < planned.ops().size(); ++i) {
    const graph::Op& op = planned.ops()[i];
    if (op.device.value() != impl->rank) continue;
    auto& slots = impl->op_params[i];
    for (const auto& o : op.outputs) impl->producer_stage[o.tensor.value()] = op.stage;
    for (const auto& in : op.inputs) impl->consumed[op.stage.value()].insert(in.tensor.value());
    for (const auto& in : op.inputs) {
      const graph::FullTensor& t = planned.tensor(in.tensor);
      slots.push_back(-1);
      if (t.role != graph::TensorRole::kParameter) continue;
      auto key = std::make_pair(t.id.value(), in.ranges_string());
      if (auto it = impl->param_index.find(key); it != impl->param_index.end()) {
        slots.back() = static_cast<int64_t>(it->second);
        continue;
      }
      slots.back() = static_cast<int64_t>(impl->params.size());
      at::Tensor p = init_parameter_piece(t, in, seed);
      p.set_requires_grad(true);
      impl->param_index[key] = impl->params.size();
      impl->params.push_back(p);
      impl->pieces.push_back(in);
      auto h = holders.find(key);
      impl->replicas.push_back(h == holders.end() ? 1 : h->second);
    }
  }
  return std::unique_ptr<RankExecutor>(new RankExecutor(std::move(impl)));
}

namespace {

using Inputs = std::vector<std::unordered_map<int64_t, at::Tensor>>;

// A forward block: the segment's adapters and ops in order for micro-batch `mb`.
void run_forward(RankExecutor::Impl& s, const lower::Segment& seg, int64_t mb,
                 const Inputs& inputs) {
  const auto& ops = s.graph.ops();
  RankExecutor::Impl::Micro& m = s.micro[static_cast<size_t>(mb)];
  for (const lower::SegmentItem& item : seg.items) {
    if (item.kind == lower::SegmentItem::Kind::kAdapter) {
      const Adapter& a = s.lowered.adapters[static_cast<size_t>(item.index)];
      const Shape& full = s.shape_of(a.tensor);
      if (item.producer_side) {
        at::Tensor x = m.env.at(a.tensor.value());
        s.run_path(a.forward, full, x.detach(), Part::kProducer, s.tag(a, 0, mb));
        m.sent[a.id] = x;
      } else if (a.disjoint) {
        at::Tensor z = s.run_path(a.forward, full, at::Tensor(), Part::kConsumer, s.tag(a, 0, mb));
        m.adapted[a.id] = z.detach().requires_grad_(true);
      } else if (a.cross_stage()) {
        auto it = m.env.find(a.tensor.value());
        at::Tensor x = it == m.env.end() ? at::Tensor() : it->second.detach();
        at::Tensor z = s.run_path(a.forward, full, x, Part::kAll, s.tag(a, 0, mb));
        m.adapted[a.id] = z.detach().requires_grad_(true);
      } else {
        at::Tensor x = m.env.at(a.tensor.value());
        m.adapted[a.id] = AdapterFn::apply(x, reinterpret_cast<int64_t>(&s), a.id, mb)[0];
      }
      continue;
    }
    const graph::Op& op = ops[static_cast<size_t>(item.index)];
    std::vector<at::Tensor> args;
    const auto& slots = s.op_params[static_cast<size_t>(item.index)];
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      const graph::SubTensor& in = op.inputs[k];
      const graph::FullTensor& t = s.graph.tensor(in.tensor);
      if (t.role == graph::TensorRole::kInput) {
        args.push_back(
            cut_piece(inputs[static_cast<size_t>(mb)].at(t.id.value()), in).contiguous());
      } else if (t.role == graph::TensorRole::kParameter) {
        args.push_back(s.params[static_cast<size_t>(slots[k])]);
      } else if (auto a = s.adapter_of.find({t.id.value(), op.def->name});
                 a != s.adapter_of.end()) {
        args.push_back(m.adapted.at(a->second));
      } else if (s.producer_stage.at(t.id.value()) == op.stage) {
        args.push_back(m.env.at(t.id.value()));
      } else {
        auto& leaf = m.leaves[t.id.value()];
        if (!leaf.defined()) leaf = m.env.at(t.id.value()).detach().requires_grad_(true);
        args.push_back(leaf);
      }
    }
    std::vector<at::Tensor> outs = (*s.kernels->find(op.type()))(KernelContext{s.graph, op}, args);
    for (size_t o = 0; o < outs.size(); ++o) m.env[op.outputs[o].tensor.value()] = outs[o];
    if (s.graph.tensor(op.outputs[0].tensor).role == graph::TensorRole::kLoss) {
      m.loss = outs[0];
      m.loss_tensor = op.outputs[0].tensor;
    }
  }
}

// A backward block: autograd from the stage's roots (the loss, received output gradients,
// gradients pending from later stages on this rank), then the gradient paths of the adapters
// that ran outside autograd.
void run_backward(RankExecutor::Impl& s, const lower::Program& prog,
                  const lower::ProgramBlock& block, const lower::Segment& seg, int64_t mb,
                  double grad_scale) {
  RankExecutor::Impl::Micro& m = s.micro[static_cast<size_t>(mb)];
  std::map<int64_t, std::pair<at::Tensor, at::Tensor>> roots = m.pending[block.stage.value()];
  auto add_root = [&](int64_t tensor, const at::Tensor& value, const at::Tensor& grad) {
    auto it = roots.find(tensor);
    if (it == roots.end())
      roots[tensor] = {value, grad};
    else
      it->second.second = it->second.second + grad;
  };
  if (m.loss.defined() && s.producer_stage.at(m.loss_tensor.value()) == block.stage)
    add_root(m.loss_tensor.value(), m.loss, at::full_like(m.loss, prog.loss_seed * grad_scale));
  for (auto it = seg.items.rbegin(); it != seg.items.rend(); ++it)
    if (it->kind == lower::SegmentItem::Kind::kAdapter && it->producer_side) {
      const Adapter& a = s.lowered.adapters[static_cast<size_t>(it->index)];
      at::Tensor g = s.run_path(a.backward, s.shape_of(a.tensor), at::Tensor(), Part::kConsumer,
                                s.tag(a, 1, mb));
      add_root(a.tensor.value(), m.sent.at(a.id), g);
    }
  std::vector<at::Tensor> tensors, grads;
  for (auto& [id, tg] : roots)
    if (tg.first.requires_grad()) {
      tensors.push_back(tg.first);
      grads.push_back(tg.second);
    }
  if (!tensors.empty()) torch::autograd::backward(tensors, grads);
  for (auto it = seg.items.rbegin(); it != seg.items.rend(); ++it) {
    if (it->kind != lower::SegmentItem::Kind::kAdapter || it->producer_side) continue;
    const Adapter& a = s.lowered.adapters[static_cast<size_t>(it->index)];
    if (!a.disjoint && !a.cross_stage()) continue;  // ran inside autograd
    at::Tensor z = m.adapted.at(a.id);
    at::Tensor g = z.grad().defined() ? z.grad() : at::zeros_like(z);
    if (a.disjoint) {
      s.run_path(a.backward, s.shape_of(a.tensor), g, Part::kProducer, s.tag(a, 1, mb));
    } else {
      at::Tensor gx = s.run_path(a.backward, s.shape_of(a.tensor), g, Part::kAll, s.tag(a, 1, mb));
      auto x = m.env.find(a.tensor.value());
      if (x != m.env.end() && gx.defined())
        m.pending[s.producer_stage.at(a.tensor.value()).value()][a.tensor.value()] = {x->second,
                                                                                      gx};
    }
  }
  for (auto& [tensor, leaf] : m.leaves) {
    if (s.producer_stage.at(tensor) == block.stage || !leaf.grad().defined()) continue;
    if (!s.consumed[block.stage.value()].count(tensor)) continue;
    auto& slot = m.pending[s.producer_stage.at(tensor).value()][tensor];
    slot = {m.env.at(tensor), slot.second.defined() ? slot.second + leaf.grad() : leaf.grad()};
  }
}

// Gradients of parameter pieces held by several ranks, summed over those ranks.
void sync_gradients(RankExecutor::Impl& s, const lower::Program& prog) {
  // Gradients of parameter pieces held by several ranks are summed over those ranks: one
  // flat all-reduce per group of ranks (a bucket), in the same order on every rank.
  std::map<std::vector<int64_t>, std::vector<at::Tensor*>> buckets;
  std::vector<std::vector<int64_t>> bucket_order;
  for (int64_t id : prog.grad_syncs) {
    const auto& sync = s.lowered.grad_syncs[static_cast<size_t>(id)];
    std::vector<int64_t> key;
    for (DeviceId d : sync.devices) key.push_back(d.value());
    at::Tensor& p = s.params[s.param_index.at({sync.tensor.value(), sync.piece.ranges_string()})];
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    if (!buckets.count(key)) bucket_order.push_back(key);
    buckets[key].push_back(&p);
  }
  for (const auto& key : bucket_order) {
    std::vector<at::Tensor> grads;
    for (at::Tensor* p : buckets[key]) grads.push_back(p->grad().reshape({-1}));
    at::Tensor flat = at::cat(grads);
    std::vector<DeviceId> members;
    for (int64_t r : key) members.push_back(DeviceId(r));
    check(s.runner->group(members).all_reduce(flat));
    int64_t offset = 0;
    for (at::Tensor* p : buckets[key]) {
      const int64_t n = p->numel();
      p->mutable_grad().copy_(flat.narrow(0, offset, n).view(p->sizes()));
      offset += n;
    }
  }
}

}  // namespace

Result<double> RankExecutor::run(const std::vector<std::unordered_map<int64_t, at::Tensor>>& inputs,
                                 double grad_scale) {
  Impl& s = *impl_;
  const lower::Program& prog = s.lowered.programs[static_cast<size_t>(s.rank)];
  s.micro.assign(inputs.size(), Impl::Micro{});
  for (auto& p : s.params) p.mutable_grad() = at::Tensor();
  // A micro-batch's tensors are released after its last block on this rank (only its loss
  // value stays for the step's total), so a rank holds what its schedule has in flight.
  std::vector<size_t> last_block(inputs.size(), 0);
  for (size_t i = 0; i < prog.blocks.size(); ++i)
    last_block[static_cast<size_t>(prog.blocks[i].micro_batch.value())] = i;
  try {
    for (size_t block_index = 0; block_index < prog.blocks.size(); ++block_index) {
      const lower::ProgramBlock& block = prog.blocks[block_index];
      const int64_t mb = block.micro_batch.value();
      Impl::Micro& m = s.micro[static_cast<size_t>(mb)];
      const lower::Segment* seg = nullptr;
      for (const auto& sg : prog.segments)
        if (sg.stage == block.stage) seg = &sg;
      LOOM_CHECK(seg) << "rank " << s.rank << " has no segment for stage " << block.stage;

      if (block.kind == lower::BlockKind::kForward) {
        run_forward(s, *seg, mb, inputs);
        continue;
      }

      // Backward of this stage for this micro-batch.
      run_backward(s, prog, block, *seg, mb, grad_scale);
      if (block_index == last_block[static_cast<size_t>(mb)]) {
        at::Tensor loss = m.loss.defined() ? m.loss.detach() : at::Tensor();
        m = Impl::Micro{};
        m.loss = loss;
      }
    }
    check(s.runner->flush());
    sync_gradients(s, prog);
    at::Tensor loss = at::zeros({}, at::kDouble);
    for (auto& m : s.micro)
      if (m.loss.defined()) loss += m.loss.detach().to(at::kDouble) * prog.loss_seed;
    check(s.world->all_reduce(loss));
    return loss.item<double>();
  } catch (const CommFailure& e) {
    return Error::at("comm", e.what());
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    return Error::at("comm", what);
  }
}

const std::vector<at::Tensor>& RankExecutor::parameters() const { return impl_->params; }
const std::vector<graph::SubTensor>& RankExecutor::parameter_pieces() const {
  return impl_->pieces;
}
const std::vector<int64_t>& RankExecutor::parameter_replicas() const { return impl_->replicas; }
comm::Comm& RankExecutor::world() { return *impl_->world; }

}  // namespace loom::runtime
