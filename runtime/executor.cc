// Running the rank's program: a step's forward, backward and weight-gradient blocks, their
// adapters and receives, and the sums a step hands on. Resolving the program once, before any
// step, is executor_setup.cc.
#include "runtime/executor.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <tuple>

#include "runtime/deferred_linear.h"
#include "runtime/executor_impl.h"
#include "runtime/grad_buckets.h"
#include "runtime/linear.h"
#include "runtime/oracle.h"
#include "runtime/path_runner.h"
#include "runtime/step_trace.h"

namespace loom::runtime {
namespace {

using lower::Adapter;
using lower::CommPath;
using lower::CommStep;
using lower::Primitive;

using Part = PathPart;

}  // namespace

namespace {

// An adapter within a stage: forward path as the function, gradient path as its backward.
struct AdapterFn : public torch::autograd::Function<AdapterFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::Tensor x,
                                                int64_t impl, int64_t adapter, int64_t mb) {
    ctx->saved_data["impl"] = impl;
    ctx->saved_data["adapter"] = adapter;
    ctx->saved_data["mb"] = mb;
    auto* self = reinterpret_cast<Executor::Impl*>(impl);
    const Adapter& a = self->lowered.adapters[static_cast<size_t>(adapter)];
    return {self->run_path(a.forward, a.tensor, x, Part::kAll, self->tag(a, 0, mb))};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* self = reinterpret_cast<Executor::Impl*>(ctx->saved_data["impl"].toInt());
    const Adapter& a =
        self->lowered.adapters[static_cast<size_t>(ctx->saved_data["adapter"].toInt())];
    at::Tensor g = self->run_path(a.backward, a.tensor, grads[0], Part::kAll,
                                  self->tag(a, 1, ctx->saved_data["mb"].toInt()));
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

Executor::Executor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Executor::~Executor() = default;

namespace {

using Source = Executor::Impl::Source;
using ForwardStep = Executor::Impl::ForwardStep;

}  // namespace

namespace {

// The inputs on the device: host tensors are copied from pinned memory without the host waiting
// (the copies run on the current stream before the kernels that read them).
Inputs to_device(const Inputs& inputs, const RunDevice& d) {
  Inputs out(inputs.size());
  for (size_t m = 0; m < inputs.size(); ++m)
    for (const auto& [id, t] : inputs[m])
      out[m][id] = t.device() == d.device ? t : t.pin_memory().to(d.device, /*non_blocking=*/true);
  return out;
}

}  // namespace

at::Tensor read(Executor::Impl& s, Executor::Impl::Micro& m, const Source& src,
                const graph::SubTensor& in, int64_t mb, const Inputs& inputs) {
  switch (src.kind) {
    case Source::Kind::kInput:
      return cut_piece(inputs[static_cast<size_t>(mb)].at(src.index), in).contiguous();
    case Source::Kind::kParameter:
      if (!m.params.empty()) return m.params.at(src.index);
      return s.compute_params[static_cast<size_t>(src.index)];
    case Source::Kind::kAdapter:
      return m.adapted.at(src.index);
    case Source::Kind::kSameStage:
      return s.value(m, src.index);
    case Source::Kind::kStageLeaf: {
      auto& leaf = m.leaves[src.index];
      if (!leaf.defined()) leaf = s.value(m, src.index).detach().requires_grad_(true);
      return leaf;
    }
  }
  return at::Tensor();
}

namespace {

void drop_gathered(Executor::Impl& s, Executor::Impl::Micro& m, const Source& src) {
  if (src.kind == Source::Kind::kAdapter &&
      s.lowered.adapters[static_cast<size_t>(src.index)].parameter)
    m.adapted.erase(src.index);
}

// Runs an adapter item of a forward block.
void run_adapter(Executor::Impl& s, Executor::Impl::Micro& m, const lower::SegmentItem& item,
                 int64_t mb) {
  const Adapter& a = s.lowered.adapters[static_cast<size_t>(item.index)];
  if (a.parameter) {
    run_parameter_adapter(s, m, item, mb);
    return;
  }
  const at::Tensor& held = m.env[static_cast<size_t>(a.tensor.value())];
  if (item.producer_side) {
    at::Tensor x = s.value(m, a.tensor.value());
    s.run_path(a.forward, a.tensor, x.detach(), Part::kProducer, s.tag(a, 0, mb));
    m.sent[a.id] = x;
  } else if (a.disjoint) {
    at::Tensor z = s.run_path(a.forward, a.tensor, at::Tensor(), Part::kConsumer, s.tag(a, 0, mb));
    m.adapted[a.id] = z.detach().requires_grad_(true);
  } else if (a.cross_stage()) {
    at::Tensor x = held.defined() ? held.detach() : at::Tensor();
    at::Tensor z = s.run_path(a.forward, a.tensor, x, Part::kAll, s.tag(a, 0, mb));
    m.adapted[a.id] = z.detach().requires_grad_(true);
  } else {
    m.adapted[a.id] =
        AdapterFn::apply(s.value(m, a.tensor.value()), reinterpret_cast<int64_t>(&s), a.id, mb)[0];
  }
}

}  // namespace

void run_steps(Executor::Impl& s, Executor::Impl::Micro& m, size_t segment, size_t begin,
               size_t end, int64_t mb, const Inputs& inputs) {
  const auto& ops = s.graph.ops();
  std::vector<at::Tensor> args;
  for (size_t i = begin; i < end; ++i) {
    const ForwardStep& step = s.forward_steps[segment][i];
    if (step.adapter) {
      run_adapter(s, m, *step.adapter, mb);
      continue;
    }
    const graph::Op& op = ops[step.op];
    args.clear();
    for (size_t k = 0; k < step.sources.size(); ++k)
      args.push_back(read(s, m, step.sources[k], step.reads[k], mb, inputs));
    std::vector<at::Tensor> outs;
    const graph::Op* made = step.fused_bias >= 0 ? &ops[static_cast<size_t>(step.fused_bias)] : &op;
    if (step.fused_bias >= 0 || step.deferred || step.gathered >= 0 || step.linear) {
      const at::Tensor bias =
          step.fused_bias >= 0 ? read(s, m, step.bias, made->inputs[1], mb, inputs) : at::Tensor();
      outs.push_back(
          step.gathered >= 0 ? gathered_linear(s, m, args[0], args[1], bias, step.gathered, mb)
          : step.deferred
              // The micro-batch's own stash, also when `m` is a recomputed
              // region's scratch (its backward stashes after the scratch is gone).
              ? deferred_linear(args[0], args[1], bias,
                                s.micro[static_cast<size_t>(mb)].deferred[op.stage.value()],
                                step.sources[1].index, s.device.linear)
              : runtime::linear(args[0], args[1], bias, s.device.linear));
    } else {
      outs = (*step.kernel)(KernelContext{s.graph, op}, args);
      LOOM_CHECK(outs.size() == op.outputs.size())
          << "kernel of " << op.type() << " returned " << outs.size() << " outputs";
    }
    for (size_t o = 0; o < outs.size(); ++o)
      if (outs[o].scalar_type() != step.out_dtypes[o] && at::isFloatingType(outs[o].scalar_type()))
        outs[o] = outs[o].to(step.out_dtypes[o]);
    for (size_t o = 0; o < outs.size(); ++o)
      m.env[static_cast<size_t>(made->outputs[o].tensor.value())] = outs[o];
    if (step.makes_loss) {
      m.loss = outs[0];
      m.loss_tensor = made->outputs[0].tensor;
    }
    // Forward blocks only: a recomputed region runs its ops again in the backward.
    if (step.metric_weight > 0 && s.forwarding) {
      const at::Tensor v = outs[0].detach().to(at::kDouble) * step.metric_weight;
      s.aux_total = s.aux_total.defined() ? s.aux_total + v : v;
      // Its first input counts the tokens each expert was chosen by (whole, on every holder).
      const at::Tensor counts = args[0].detach().to(at::kDouble);
      const at::Tensor load = (counts.max() / counts.mean().clamp_min(1e-30)).reshape({});
      const at::Tensor weighted = load * step.metric_weight;
      s.load_sum = s.load_sum.defined() ? s.load_sum + weighted : weighted;
      s.load_count += step.metric_weight;
    }
    // A gathered parameter has one reader (lower/param_shards.h): it lives on only where
    // autograd keeps it.
    args.clear();
    for (const Source& src : step.sources) drop_gathered(s, m, src);
    if (step.fused_bias >= 0) drop_gathered(s, m, step.bias);
  }
}

namespace {

// A forward block: the segment's adapters and ops in order for micro-batch `mb`, each
// recomputed region as one autograd function.
void run_forward(Executor::Impl& s, size_t segment, int64_t mb, const Inputs& inputs) {
  Executor::Impl::Micro& m = s.micro[static_cast<size_t>(mb)];
  const auto& starts = s.region_start[segment];
  for (size_t i = 0; i < starts.size();) {
    if (starts[i] < 0) {
      run_steps(s, m, segment, i, i + 1, mb, inputs);
      ++i;
      continue;
    }
    run_region(s, m, segment, static_cast<size_t>(starts[i]), mb, inputs);
    i = s.regions[segment][static_cast<size_t>(starts[i])].end;
  }
  // Gathered parameters live on only where autograd keeps them.
  finish_prefetch(s);
  for (const ForwardStep& step : s.forward_steps[segment])
    if (step.adapter && s.lowered.adapters[static_cast<size_t>(step.adapter->index)].parameter)
      m.adapted.erase(step.adapter->index);
}

// A backward block: autograd from the stage's roots (the loss, received output gradients,
// gradients pending from later stages on this rank), then the gradient paths of the adapters
// that ran outside autograd.
void run_backward(Executor::Impl& s, const lower::Program& prog, const lower::ProgramBlock& block,
                  const lower::Segment& seg, int64_t mb, double grad_scale) {
  Executor::Impl::Micro& m = s.micro[static_cast<size_t>(mb)];
  std::map<int64_t, std::pair<at::Tensor, at::Tensor>> roots = m.pending[block.stage.value()];
  auto add_root = [&](int64_t tensor, const at::Tensor& value, const at::Tensor& grad) {
    auto it = roots.find(tensor);
    if (it == roots.end())
      roots[tensor] = {value, grad};
    else
      it->second.second = it->second.second + grad;
  };
  if (m.loss.defined() && s.stage_of(m.loss_tensor.value()) == block.stage.value())
    add_root(m.loss_tensor.value(), m.loss, at::full_like(m.loss, prog.loss_seed * grad_scale));
  for (auto it = seg.items.rbegin(); it != seg.items.rend(); ++it)
    if (it->kind == lower::SegmentItem::Kind::kAdapter && it->producer_side) {
      const Adapter& a = s.lowered.adapters[static_cast<size_t>(it->index)];
      at::Tensor g =
          s.run_path(a.backward, a.tensor, at::Tensor(), Part::kConsumer, s.tag(a, 1, mb));
      add_root(a.tensor.value(), m.sent.at(a.id), g);
    }
  std::vector<at::Tensor> tensors, grads;
  for (auto& [id, tg] : roots)
    if (tg.first.requires_grad()) {
      tensors.push_back(tg.first);
      grads.push_back(tg.second);
    }
  if (!tensors.empty()) torch::autograd::backward(tensors, grads);
  finish_prefetch(s);  // a weight gathered ahead that this backward did not reach
  for (auto it = seg.items.rbegin(); it != seg.items.rend(); ++it) {
    if (it->kind != lower::SegmentItem::Kind::kAdapter || it->producer_side) continue;
    const Adapter& a = s.lowered.adapters[static_cast<size_t>(it->index)];
    if (!a.disjoint && !a.cross_stage()) continue;  // ran inside autograd
    at::Tensor z = m.adapted.at(a.id);
    at::Tensor g = z.grad().defined() ? z.grad() : at::zeros_like(z);
    if (a.disjoint) {
      s.run_path(a.backward, a.tensor, g, Part::kProducer, s.tag(a, 1, mb));
    } else {
      at::Tensor gx = s.run_path(a.backward, a.tensor, g, Part::kAll, s.tag(a, 1, mb));
      const at::Tensor& x = m.env[static_cast<size_t>(a.tensor.value())];
      if (x.defined() && gx.defined())
        m.pending[s.stage_of(a.tensor.value())][a.tensor.value()] = {x, gx};
    }
  }
  for (auto& [tensor, leaf] : m.leaves) {
    const int64_t made_in = s.stage_of(tensor);
    if (made_in == block.stage.value() || !leaf.grad().defined()) continue;
    if (!s.consumed[block.stage.value()].count(tensor)) continue;
    auto& slot = m.pending[made_in][tensor];
    slot = {s.value(m, tensor), slot.second.defined() ? slot.second + leaf.grad() : leaf.grad()};
  }
}

// Adds a gradient computed outside autograd to parameter slot `slot`'s float32 master, counted
// by the gradient buckets when it is bucketed (its all-reduce may start then).
void accumulate_grad(Executor::Impl& s, int64_t slot, const at::Tensor& grad) {
  at::Tensor& p = s.params[static_cast<size_t>(slot)];
  if (s.buckets && s.buckets->holds(p)) {
    s.buckets->accumulate(p, grad);
  } else if (!p.grad().defined()) {
    p.mutable_grad() = grad;
  } else {
    p.mutable_grad().add_(grad);
  }
}

// A weight-gradient block: the matrix products the stage's input-gradient block of micro-batch
// `mb` deferred, each parameter's summed and accumulated once.
void run_weight_grad(Executor::Impl& s, const lower::ProgramBlock& block, int64_t mb) {
  Executor::Impl::Micro& m = s.micro[static_cast<size_t>(mb)];
  auto it = m.deferred.find(block.stage.value());
  if (it == m.deferred.end()) return;
  // Outside autograd, as its accumulations are: gradients are never part of a graph.
  at::NoGradGuard no_grad;
  for (const auto& [slot, grad] : it->second.take_weight_grads()) accumulate_grad(s, slot, grad);
  m.deferred.erase(it);
}

// Posts the receives `block` starts with (a pipeline stage's activations in a forward, its
// output gradients in a backward) before the block before it computes, so they arrive meanwhile.
void prepost_receives(Executor::Impl& s, const lower::ProgramBlock& block) {
  auto seg = s.segment_of_stage.find(block.stage.value());
  if (seg == s.segment_of_stage.end()) return;
  const lower::Program& prog = s.lowered.programs[static_cast<size_t>(s.rank)];
  const int64_t mb = block.micro_batch.value();
  if (block.kind == lower::BlockKind::kW) return;  // no communication
  const bool forward = block.kind == lower::BlockKind::kF;
  for (const lower::SegmentItem& it : prog.segments[seg->second].items) {
    if (it.kind != lower::SegmentItem::Kind::kAdapter) continue;
    const Adapter& a = s.lowered.adapters[static_cast<size_t>(it.index)];
    const auto t = static_cast<size_t>(a.tensor.value());
    if (forward && !it.producer_side && a.disjoint)
      s.runner->prepost(a.forward, s.graph.tensor(a.tensor).shape, Part::kConsumer, s.tag(a, 0, mb),
                        s.dtype[t]);
    else if (!forward && it.producer_side)
      s.runner->prepost(a.backward, s.graph.tensor(a.tensor).shape, Part::kConsumer,
                        s.tag(a, 1, mb), s.dtype[t]);
  }
}

// This rank's share of the step's sums: its loss pieces (weighted by the loss seed, so
// replicated losses count once) and its gradients' squared norm (each piece divided by how
// many ranks hold it, so every element counts once).
at::Tensor local_sums(const Executor::Impl& s, const lower::Program& prog, bool with_grads,
                      bool stop) {
  // On the device the parameters live on, so the step reads the host once, at the end.
  const auto options = at::TensorOptions()
                           .dtype(at::kDouble)
                           .device(s.params.empty() ? at::Device(at::kCPU) : s.params[0].device());
  at::Tensor loss = at::zeros({}, options);
  for (const auto& m : s.micro)
    if (m.loss.defined()) loss += m.loss.detach().to(at::kDouble) * prog.loss_seed;
  std::vector<at::Tensor> grads;
  std::vector<double> weights;
  for (size_t i = 0; i < s.params.size() && with_grads; ++i) {
    const at::Tensor& g = s.params[i].grad();
    if (!g.defined()) continue;
    // Under ZeRO-1 each element of a shared piece's summed gradient is on its owner only.
    if (s.buckets && s.buckets->zero1() && s.replicas[i] > 1) {
      const auto [begin, end] = s.buckets->owned(s.params[i]);
      if (begin == end) continue;
      grads.push_back(g.reshape({-1}).narrow(0, begin, end - begin));
      weights.push_back(1.0);
      continue;
    }
    grads.push_back(g);
    weights.push_back(1.0 / static_cast<double>(s.replicas[i]));
  }
  at::Tensor norm = at::zeros({}, options);
  if (!grads.empty()) {
    at::Tensor norms = at::stack(at::_foreach_norm(grads)).to(at::kDouble);
    norm = (norms.square() * at::tensor(weights, at::kDouble).to(options.device())).sum();
  }
  auto scalar = [&](const at::Tensor& t) {
    return t.defined() ? t.to(options.device()).reshape({}) : at::zeros({}, options);
  };
  // The experts' load (weighted sum, weights summed) and the stop request ride the all-reduce.
  return at::stack({loss, norm, scalar(s.aux_total), scalar(s.load_sum),
                    at::full({}, s.load_count, options), at::full({}, stop ? 1. : 0., options)});
}

// Runs the rank's program over `inputs`: every block, or with `forward_only` the forward blocks
// alone in the program's order (a validation pass: no backward, no gradient, nothing the
// optimizer reads is touched).
Result<StepSums> run_program(Executor::Impl& s, const Inputs& inputs, double grad_scale,
                             bool forward_only, bool stop_requested) {
  const lower::Program& prog = s.lowered.programs[static_cast<size_t>(s.rank)];
  // Dropping the backward blocks keeps the forward blocks' order on every rank, and their
  // sends and receives still pair up: forward messages only ever flow to later blocks.
  std::vector<const lower::ProgramBlock*> blocks;
  for (const lower::ProgramBlock& b : prog.blocks)
    if (!forward_only || b.kind == lower::BlockKind::kF) blocks.push_back(&b);
  std::optional<at::NoGradGuard> no_grad;
  if (forward_only) no_grad.emplace();
  s.micro.assign(inputs.size(), Executor::Impl::Micro{});
  s.aux_total = at::Tensor();
  s.load_sum = at::Tensor();
  s.load_count = 0;
  for (auto& m : s.micro) m.env.resize(s.graph.tensors().size());
  if (!forward_only) {
    for (auto& p : s.params) p.mutable_grad() = at::Tensor();
    if (s.buckets) s.buckets->begin_step();
  }
  const Inputs on_device = s.device.cuda() ? to_device(inputs, s.device) : Inputs();
  const Inputs& in = s.device.cuda() ? on_device : inputs;
  s.compute_params.clear();
  for (const at::Tensor& p : s.params)
    s.compute_params.push_back(s.device.compute == at::kFloat ? p : p.to(s.device.compute));
  // A micro-batch's tensors are released after its last block on this rank (only its loss
  // value stays for the step's total), so a rank holds only what its schedule has in flight.
  std::vector<size_t> last_block(inputs.size(), 0);
  for (size_t i = 0; i < blocks.size(); ++i)
    last_block[static_cast<size_t>(blocks[i]->micro_batch.value())] = i;
  auto release = [&](int64_t mb) {
    Executor::Impl::Micro& m = s.micro[static_cast<size_t>(mb)];
    at::Tensor loss = m.loss.defined() ? m.loss.detach() : at::Tensor();
    m = Executor::Impl::Micro{};
    m.loss = loss;
  };
  try {
    for (size_t block_index = 0; block_index < blocks.size(); ++block_index) {
      const lower::ProgramBlock& block = *blocks[block_index];
      observe::TraceSpan span(s.tracer, [&] { return block_event(block); });
      if (block_index == 0) prepost_receives(s, block);
      if (block_index + 1 < blocks.size()) prepost_receives(s, *blocks[block_index + 1]);
      const int64_t mb = block.micro_batch.value();
      s.forwarding = block.kind == lower::BlockKind::kF;
      auto seg = s.segment_of_stage.find(block.stage.value());
      LOOM_CHECK(seg != s.segment_of_stage.end())
          << "rank " << s.rank << " has no segment for stage " << block.stage;
      if (block.kind == lower::BlockKind::kF) {
        run_forward(s, seg->second, mb, in);
        if (forward_only && block_index == last_block[static_cast<size_t>(mb)]) release(mb);
        continue;
      }
      if (block.kind == lower::BlockKind::kW)
        run_weight_grad(s, block, mb);
      else
        run_backward(s, prog, block, prog.segments[seg->second], mb, grad_scale);
      if (block_index == last_block[static_cast<size_t>(mb)]) release(mb);
    }
    check(s.runner->flush());
    if (s.buckets && !forward_only) check(s.buckets->finish());
    at::Tensor sums = local_sums(s, prog, /*with_grads=*/!forward_only, stop_requested);
    if (s.world->size() > 1) check(s.world->all_reduce(sums));
    sums = sums.cpu();  // the step's one host read
    s.compute_params.clear();
    // A GPU backend's failure surfaces after the work it broke: the step is not done then.
    check(s.world->status());
    const double* v = sums.data_ptr<double>();
    return StepSums{v[0], v[1], v[2], v[4] > 0 ? v[3] / v[4] : 0.0, v[5] > 0};
  } catch (const CommFailure& e) {
    return Error::at("comm", e.what());
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    return Error::at("comm", what);
  }
}

}  // namespace

Result<StepSums> Executor::run(const std::vector<std::unordered_map<int64_t, at::Tensor>>& inputs,
                               double grad_scale, bool stop_requested) {
  return run_program(*impl_, inputs, grad_scale, /*forward_only=*/false, stop_requested);
}

Result<StepSums> Executor::evaluate(
    const std::vector<std::unordered_map<int64_t, at::Tensor>>& inputs) {
  return run_program(*impl_, inputs, 0.0, /*forward_only=*/true, /*stop_requested=*/false);
}

std::map<int64_t, graph::Range> Executor::input_rows() const {
  std::map<int64_t, graph::Range> rows;
  for (const auto& segment : impl_->forward_steps)
    for (const Impl::ForwardStep& step : segment)
      for (size_t k = 0; k < step.sources.size(); ++k) {
        if (step.sources[k].kind != Impl::Source::Kind::kInput) continue;
        const graph::Range read = step.reads[k].ranges.at(0);
        auto [it, fresh] = rows.emplace(step.sources[k].index, read);
        if (!fresh)
          it->second = {std::min(it->second.start, read.start), std::max(it->second.end, read.end)};
      }
  return rows;
}

const std::vector<at::Tensor>& Executor::parameters() const { return impl_->params; }
const std::vector<graph::SubTensor>& Executor::parameter_pieces() const { return impl_->pieces; }
const std::vector<int64_t>& Executor::parameter_replicas() const { return impl_->replicas; }
std::vector<std::pair<int64_t, int64_t>> Executor::parameter_owned() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const at::Tensor& p : impl_->params)
    out.push_back(impl_->buckets ? impl_->buckets->owned(p)
                                 : std::make_pair(int64_t{0}, p.numel()));
  return out;
}
Status Executor::gather_parameters() {
  if (!impl_->buckets) return Status::success();
  try {
    return impl_->buckets->gather_parameters();
  } catch (const c10::Error& e) {
    return Error::at("comm", e.what_without_backtrace());
  }
}
at::Tensor Executor::parameter(const std::string& name) const {
  for (size_t i = 0; i < impl_->pieces.size(); ++i)
    if (impl_->graph.tensor(impl_->pieces[i].tensor).name == name) return impl_->params[i];
  return at::Tensor();
}
Executor::GatherCounts Executor::gather_counts() const { return impl_->gather_counts; }
comm::Comm& Executor::world() { return *impl_->world; }
const RunDevice& Executor::device() const { return impl_->device; }
const GradBuckets* Executor::gradient_buckets() const { return impl_->buckets.get(); }
void Executor::set_tracer(observe::Tracer* tracer) {
  impl_->tracer = tracer;
  impl_->runner->set_tracer(tracer);
  if (impl_->buckets) impl_->buckets->set_tracer(tracer);
}

}  // namespace loom::runtime
