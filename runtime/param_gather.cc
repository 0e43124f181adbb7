// parallel.zero 3 in the runtime (lower/param_shards.h): a rank stores its shard of each
// sharded parameter; each read gathers it through the parameter's adapter, one gather ahead of
// its use in a forward block, and a linear's weight is gathered again for its backward instead of
// being kept between a micro-batch's forward and backward.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "runtime/executor_impl.h"
#include "runtime/linear.h"

namespace loom::runtime {
namespace {

using lower::Adapter;

// The gather of adapter `a` for micro-batch `mb`: the one started ahead, or run now.
at::Tensor gather(Executor::Impl& s, const Adapter& a, const at::Tensor& shard, int64_t mb) {
  Executor::Impl::Prefetch& p = s.prefetch;
  ++s.gather_counts.gathers;
  if (p.adapter == a.id && p.mb == mb) {
    ++s.gather_counts.ahead;
    p.adapter = -1;
    PathRunner::Started started = std::move(p.started);
    p.started = {};
    auto r = s.runner->finish(started);
    if (!r.ok()) throw CommFailure(r.error().message);
    return *r;
  }
  return s.run_path(a.forward, a.tensor, shard.detach(), PathPart::kAll, s.tag(a, 0, mb));
}

// Starts the gather of adapter `id` for micro-batch `mb` now, when nothing else is started and
// its path is one all-gather; gather() takes it.
void gather_ahead(Executor::Impl& s, int64_t id, int64_t mb) {
  if (s.prefetch.adapter >= 0) return;
  const Adapter& b = s.lowered.adapters[static_cast<size_t>(id)];
  if (!s.runner->is_one_all_gather(b.forward)) return;
  // The shard's values; what autograd tracks is read where it is used.
  const at::Tensor& shard = s.compute_params[static_cast<size_t>(s.shard_slot.at(b.id))];
  auto started = s.runner->start_all_gather(b.forward, shard.detach());
  if (!started.ok()) throw CommFailure(started.error().message);
  s.prefetch = {b.id, mb, std::move(*started)};
}

// The gathered piece of a sharded parameter; its backward reduce-scatters the gradient onto the
// shard (the adapter's gradient path).
struct ParamGatherFn : public torch::autograd::Function<ParamGatherFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::Tensor shard, int64_t impl, int64_t adapter,
                                                int64_t mb) {
    ctx->saved_data["impl"] = impl;
    ctx->saved_data["adapter"] = adapter;
    ctx->saved_data["mb"] = mb;
    auto* s = reinterpret_cast<Executor::Impl*>(impl);
    return {gather(*s, s->lowered.adapters[static_cast<size_t>(adapter)], shard, mb)};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* s = reinterpret_cast<Executor::Impl*>(ctx->saved_data["impl"].toInt());
    const Adapter& a = s->lowered.adapters[static_cast<size_t>(ctx->saved_data["adapter"].toInt())];
    at::Tensor g = s->run_path(a.backward, a.tensor, grads[0], PathPart::kAll,
                               s->tag(a, 1, ctx->saved_data["mb"].toInt()));
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// x·Wᵀ (+ b) for a weight W gathered from `shard`: keeps x and the shard, not W, and gathers W
// again in its backward, whose weight gradient it reduce-scatters onto the shard. The gathered
// weight travels in saved_data only for the forward (an input would be kept by the graph).
struct GatheredLinearFn : public torch::autograd::Function<GatheredLinearFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::Tensor x,
                                                at::Tensor shard, c10::optional<at::Tensor> bias,
                                                at::Tensor weight, int64_t impl, int64_t adapter,
                                                int64_t mb) {
    ctx->saved_data["impl"] = impl;
    ctx->saved_data["adapter"] = adapter;
    ctx->saved_data["mb"] = mb;
    // An optional, not an undefined tensor: autograd takes every tensor argument for a variable.
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->save_for_backward({x, shard});
    const LinearMath math = reinterpret_cast<Executor::Impl*>(impl)->device.linear;
    return {linear_product(x, weight, bias.value_or(at::Tensor()), math)};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* s = reinterpret_cast<Executor::Impl*>(ctx->saved_data["impl"].toInt());
    const Adapter& a = s->lowered.adapters[static_cast<size_t>(ctx->saved_data["adapter"].toInt())];
    const int64_t mb = ctx->saved_data["mb"].toInt();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& g = grads[0];
    at::Tensor weight = gather(*s, a, saved[1], mb);
    // The weight the backward reaches next (the segment's previous linear) is gathered meanwhile.
    if (const auto prev = s->previous_regather.find(a.id); prev != s->previous_regather.end())
      gather_ahead(*s, prev->second, mb);
    at::Tensor gx, gshard, gb;
    if (ctx->needs_input_grad(0)) gx = linear_input_grad(g, weight, s->device.linear);
    weight.reset();  // gone before the weight gradient is made and reduce-scattered
    if (ctx->needs_input_grad(1)) {
      at::Tensor gw = linear_weight_grad(g, x, s->device.linear);
      gshard = s->run_path(a.backward, a.tensor, std::move(gw), PathPart::kAll, s->tag(a, 1, mb));
    }
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2))
      gb = g.reshape({-1, g.size(-1)}).sum(0);
    return {gx, gshard, gb, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void run_parameter_adapter(Executor::Impl& s, Executor::Impl::Micro& m,
                           const lower::SegmentItem& item, int64_t mb) {
  const Adapter& a = s.lowered.adapters[static_cast<size_t>(item.index)];
  const Executor::Impl::Source shard_source{Executor::Impl::Source::Kind::kParameter,
                                            s.shard_slot.at(a.id)};
  const at::Tensor shard = read(s, m, shard_source, graph::SubTensor(), mb, Inputs());
  // A linear's weight is read once (gathered_linear) and dropped; other reads keep the gathered
  // piece in the autograd graph only where their backward needs it.
  m.adapted[a.id] = a.regather
                        ? gather(s, a, shard, mb)
                        : ParamGatherFn::apply(shard, reinterpret_cast<int64_t>(&s), a.id, mb)[0];
  // The next gather of the segment starts now and runs while this one's reader computes. Only in
  // forward blocks: a backward replaying a recomputed region runs its gathers where they are.
  if (!s.forwarding) return;
  if (const auto next = s.next_gather.find(a.id); next != s.next_gather.end())
    gather_ahead(s, next->second, mb);
}

void finish_prefetch(Executor::Impl& s) {
  if (s.prefetch.adapter < 0) return;
  s.prefetch.adapter = -1;
  PathRunner::Started started = std::move(s.prefetch.started);
  s.prefetch.started = {};
  auto r = s.runner->finish(started);
  if (!r.ok()) throw CommFailure(r.error().message);
}

at::Tensor gathered_linear(Executor::Impl& s, Executor::Impl::Micro& m, const at::Tensor& x,
                           const at::Tensor& shard, const at::Tensor& bias, int64_t adapter,
                           int64_t mb) {
  auto it = m.adapted.find(adapter);
  LOOM_CHECK(it != m.adapted.end())
      << "rank " << s.rank << ": the weight of adapter " << adapter << " was not gathered";
  const at::Tensor weight = it->second;
  m.adapted.erase(it);
  const c10::optional<at::Tensor> b =
      bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt;
  return GatheredLinearFn::apply(x, shard, b, weight, reinterpret_cast<int64_t>(&s), adapter,
                                 mb)[0];
}

}  // namespace loom::runtime
