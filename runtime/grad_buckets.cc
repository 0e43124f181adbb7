#include "runtime/grad_buckets.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "comm/comm_traits.h"
#include "core/check.h"
#include "lower/grad_bucketing.h"
#include "runtime/step_trace.h"

namespace loom::runtime {

struct GradBuckets::Bucket {
  at::Tensor flat;   // the gradients of `params`, back to back (ZeRO-1: by owner)
  at::Tensor shard;  // ZeRO-1: this member's segment of the summed gradients (in `flat` but on MPI)
  int64_t segment = 0;         // ZeRO-1: elements of each member's segment
  int64_t member = 0;          // ZeRO-1: this rank's index in the group
  std::vector<size_t> params;  // indices into params_
  std::shared_ptr<comm::Comm> comm;
  int64_t pending = 0;  // parameters whose gradient is not final yet this step
  bool started = false;
  comm::Work work;
};

// Runs after the parameter's AccumulateGrad node has added this backward's gradient.
// The autograd node may outlive the buckets (a caller keeps a parameter): the hook then does
// nothing.
struct GradBuckets::Hook : torch::autograd::FunctionPostHook {
  Hook(std::shared_ptr<GradBuckets*> owner, size_t param)
      : owner_(std::move(owner)), param_(param) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (*owner_ != nullptr) (*owner_)->accumulated(param_);
    return outputs;
  }
  std::shared_ptr<GradBuckets*> owner_;
  size_t param_;
};

namespace {

std::vector<int64_t> key_of(const std::vector<DeviceId>& members) {
  std::vector<int64_t> k;
  for (DeviceId d : members) k.push_back(d.value());
  return k;
}

}  // namespace

GradBuckets::GradBuckets(std::vector<Param> params,
                         std::map<std::vector<int64_t>, std::shared_ptr<comm::Comm>> groups,
                         int64_t bucket_bytes, bool zero1)
    : params_(std::move(params)), zero1_(zero1), self_(std::make_shared<GradBuckets*>(this)) {
  owned_.resize(params_.size());
  std::vector<std::vector<int64_t>> keys;
  for (const Param& p : params_) keys.push_back(key_of(p.group));
  const std::vector<std::vector<size_t>> members = lower::group_in_order(keys);  // per group
  std::vector<std::vector<int64_t>> group_keys;
  for (const auto& m : members) group_keys.push_back(keys[m.front()]);
  bucket_of_.assign(params_.size(), 0);
  offset_of_.assign(params_.size(), 0);
  group_buckets_.resize(group_keys.size());
  next_.assign(group_keys.size(), 0);
  for (size_t g = 0; g < group_keys.size(); ++g) {
    std::shared_ptr<comm::Comm> comm = groups.at(group_keys[g]);
    LOOM_CHECK(comm != nullptr) << "no gradient communicator for a group this rank is in";
    // Backward finishes the last-used parameters first: they fill the first bucket, which is
    // kept small (1 MiB, as DDP's) so communication starts early.
    std::vector<int64_t> numel;
    for (size_t i : members[g]) numel.push_back(params_[i].param.numel());
    const int64_t k = static_cast<int64_t>(group_keys[g].size());
    const int64_t me = static_cast<int64_t>(
        std::find(group_keys[g].begin(), group_keys[g].end(), comm->world_rank().value()) -
        group_keys[g].begin());
    for (const lower::BucketPlan& plan : lower::plan_buckets(
             numel, params_[members[g].front()].param.element_size(), bucket_bytes, k, zero1_)) {
      auto bucket = std::make_unique<Bucket>();
      bucket->comm = comm;
      bucket->segment = plan.segment;
      bucket->member = me;
      for (size_t j = 0; j < plan.params.size(); ++j) {
        const size_t i = members[g][plan.params[j]];
        bucket->params.push_back(i);
        bucket_of_[i] = buckets_.size();
        offset_of_[i] = plan.offset[j];
        owned_[i] = plan.owned(j, params_[i].param.numel(), me);
      }
      const at::TensorOptions options = params_[members[g].front()].param.options();
      bucket->flat = at::zeros({plan.buffer_elements()}, options);
      // The summed segment lands in place, in this member's part of the buffer, where the
      // backend allows it (MPI's reduce-scatter may not write inside what it reads).
      if (plan.segment > 0)
        bucket->shard = comm::comm_traits(*comm).shard_out_of_place
                            ? at::zeros({plan.segment}, options)
                            : bucket->flat.narrow(0, me * plan.segment, plan.segment);
      group_buckets_[g].push_back(buckets_.size());
      buckets_.push_back(std::move(bucket));
    }
  }
  group_of_bucket_.assign(buckets_.size(), 0);
  for (size_t g = 0; g < group_buckets_.size(); ++g)
    for (size_t b : group_buckets_[g]) group_of_bucket_[b] = g;
  // Hooks on the parameters' gradient accumulators, which must stay alive to keep them.
  for (size_t i = 0; i < params_.size(); ++i) {
    std::shared_ptr<torch::autograd::Node> acc =
        torch::autograd::impl::grad_accumulator(params_[i].param);
    LOOM_CHECK(acc != nullptr) << "a bucketed parameter does not require a gradient";
    acc->add_post_hook(std::make_unique<Hook>(self_, i));
    accumulators_.push_back(acc);
    index_of_[params_[i].param.unsafeGetTensorImpl()] = i;
  }
  remaining_.assign(params_.size(), 0);
}

GradBuckets::~GradBuckets() { *self_ = nullptr; }

bool GradBuckets::holds(const at::Tensor& param) const {
  return index_of_.count(param.unsafeGetTensorImpl()) > 0;
}

void GradBuckets::accumulate(const at::Tensor& param, const at::Tensor& grad) {
  auto it = index_of_.find(param.unsafeGetTensorImpl());
  LOOM_CHECK(it != index_of_.end()) << "accumulate: not a bucketed parameter";
  at::Tensor& p = params_[it->second].param;
  at::NoGradGuard no_grad;
  // In place once the gradient is the bucket's view, as autograd's accumulation does.
  if (!p.grad().defined())
    p.mutable_grad() = grad;
  else
    p.mutable_grad().add_(grad);
  accumulated(it->second);
}

int64_t GradBuckets::bucket_count() const { return static_cast<int64_t>(buckets_.size()); }

void GradBuckets::begin_step() {
  // Nothing is zeroed: a parameter's first accumulation of the step is copied into its view
  // (autograd hands over a fresh gradient then), later ones add to it in place.
  for (auto& b : buckets_) {
    b->pending = static_cast<int64_t>(b->params.size());
    b->started = false;
    b->work = comm::Work();
  }
  for (size_t i = 0; i < params_.size(); ++i) remaining_[i] = params_[i].accumulations;
  std::fill(next_.begin(), next_.end(), 0);
  started_early_ = 0;
  in_step_ = true;
}

at::Tensor GradBuckets::view(size_t param) const {
  const at::Tensor& p = params_[param].param;
  return buckets_[bucket_of_[param]]->flat.narrow(0, offset_of_[param], p.numel()).view(p.sizes());
}

void GradBuckets::accumulated(size_t param) {
  if (!in_step_) return;  // a backward outside a step (a test's, the oracle's)
  Bucket& b = *buckets_[bucket_of_[param]];
  at::Tensor& p = params_[param].param;
  if (remaining_[param] == params_[param].accumulations) {
    at::Tensor v = view(param);
    v.copy_(p.grad());
    p.mutable_grad() = v;
  }
  if (remaining_[param] == 0) {
    // More accumulations than the program's backward blocks: only harmless while the bucket
    // has not started reducing.
    LOOM_CHECK(!b.started) << "a parameter's gradient changed after its bucket's all-reduce "
                              "started";
    return;
  }
  if (--remaining_[param] > 0) return;
  if (--b.pending == 0) start_ready(group_of_bucket_[bucket_of_[param]], true);
}

void GradBuckets::start_ready(size_t group, bool during_backward) {
  auto& order = group_buckets_[group];
  while (next_[group] < order.size()) {
    Bucket& b = *buckets_[order[next_[group]]];
    if (during_backward && b.pending > 0) return;
    observe::TraceSpan span(tracer_, [&] {
      return comm_event(
          b.shard.defined() ? "reduce_scatter bucket (start)" : "all_reduce bucket (start)", b.flat,
          -1, -1, b.comm.get());
    });
    b.work = b.shard.defined() ? b.comm->reduce_scatter_flat_async(b.shard, b.flat)
                               : b.comm->all_reduce_async(b.flat);
    b.started = true;
    if (during_backward) ++started_early_;
    ++next_[group];
  }
}

Status GradBuckets::finish() {
  // A parameter backward never reached contributes zeros.
  for (size_t i = 0; i < params_.size(); ++i)
    if (remaining_[i] == params_[i].accumulations) {
      at::Tensor v = view(i);
      v.zero_();
      params_[i].param.mutable_grad() = v;
    }
  for (size_t g = 0; g < group_buckets_.size(); ++g) start_ready(g, false);
  in_step_ = false;
  for (auto& b : buckets_) {
    observe::TraceSpan span(tracer_, [&] {
      return comm_event(
          b->shard.defined() ? "reduce_scatter bucket (wait)" : "all_reduce bucket (wait)", b->flat,
          -1, -1, b->comm.get());
    });
    LOOM_TRY(b->work.wait());
  }
  // ZeRO-1 on MPI: the summed segment goes back to its place in the buffer, where the owned
  // parts of the pieces' gradients are.
  for (auto& b : buckets_)
    if (b->shard.defined() && !b->shard.is_alias_of(b->flat))
      b->flat.narrow(0, b->member * b->segment, b->segment).copy_(b->shard);
  return Status::success();
}

std::pair<int64_t, int64_t> GradBuckets::owned(const at::Tensor& param) const {
  auto it = index_of_.find(param.unsafeGetTensorImpl());
  if (it == index_of_.end()) return {0, param.numel()};
  return owned_[it->second];
}

Status GradBuckets::gather_parameters() {
  at::NoGradGuard no_grad;
  for (auto& bucket : buckets_) {
    Bucket& b = *bucket;
    if (b.segment == 0) continue;
    // This member's updated elements, laid out as its segment; all-gathered into the bucket's
    // buffer (its gradients are spent), from which every piece takes its values.
    at::Tensor mine = at::zeros({b.segment}, b.flat.options());
    for (size_t i : b.params) {
      const auto [begin, end] = owned_[i];
      if (begin == end) continue;
      mine.narrow(0, offset_of_[i] + begin - b.member * b.segment, end - begin)
          .copy_(params_[i].param.detach().reshape({-1}).narrow(0, begin, end - begin));
    }
    observe::TraceSpan span(
        tracer_, [&] { return comm_event("all_gather bucket", mine, -1, -1, b.comm.get()); });
    LOOM_TRY(b.comm->all_gather_flat(b.flat, mine));
    for (size_t i : b.params) params_[i].param.detach().copy_(view(i));
  }
  return Status::success();
}

}  // namespace loom::runtime
