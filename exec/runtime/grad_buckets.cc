#include "exec/runtime/grad_buckets.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "core/check.h"

namespace loom::runtime {

struct GradBuckets::Bucket {
  at::Tensor flat;             // the gradients of `params`, back to back
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

constexpr int64_t kFirstBucketBytes = int64_t{1} << 20;

std::vector<int64_t> key_of(const std::vector<DeviceId>& members) {
  std::vector<int64_t> k;
  for (DeviceId d : members) k.push_back(d.value());
  return k;
}

}  // namespace

GradBuckets::GradBuckets(std::vector<Param> params,
                         std::map<std::vector<int64_t>, std::shared_ptr<comm::Comm>> groups,
                         int64_t bucket_bytes)
    : params_(std::move(params)), self_(std::make_shared<GradBuckets*>(this)) {
  std::vector<std::vector<int64_t>> group_keys;  // in order of first appearance
  std::vector<std::vector<size_t>> members;      // params of each group
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto key = key_of(params_[i].group);
    auto it = std::find(group_keys.begin(), group_keys.end(), key);
    if (it == group_keys.end()) {
      group_keys.push_back(key);
      members.emplace_back();
      it = group_keys.end() - 1;
    }
    members[static_cast<size_t>(it - group_keys.begin())].push_back(i);
  }
  bucket_of_.assign(params_.size(), 0);
  offset_of_.assign(params_.size(), 0);
  group_buckets_.resize(group_keys.size());
  next_.assign(group_keys.size(), 0);
  for (size_t g = 0; g < group_keys.size(); ++g) {
    std::shared_ptr<comm::Comm> comm = groups.at(group_keys[g]);
    LOOM_CHECK(comm != nullptr) << "no gradient communicator for a group this rank is in";
    // Backward finishes the last-used parameters first: they fill the first bucket, which is
    // kept small (1 MiB, as DDP's) so communication starts early.
    std::vector<std::vector<size_t>> filled(1);
    int64_t bytes = 0;
    for (auto it = members[g].rbegin(); it != members[g].rend(); ++it) {
      const at::Tensor& p = params_[*it].param;
      const int64_t b = p.numel() * static_cast<int64_t>(p.element_size());
      const int64_t cap =
          filled.size() == 1 ? std::min(bucket_bytes, kFirstBucketBytes) : bucket_bytes;
      if (!filled.back().empty() && bytes + b > cap) {
        filled.emplace_back();
        bytes = 0;
      }
      filled.back().push_back(*it);
      bytes += b;
    }
    for (const auto& list : filled) {
      auto bucket = std::make_unique<Bucket>();
      bucket->comm = comm;
      int64_t n = 0;
      for (size_t i : list) {
        bucket->params.push_back(i);
        bucket_of_[i] = buckets_.size();
        offset_of_[i] = n;
        n += params_[i].param.numel();
      }
      bucket->flat = at::zeros({n}, params_[list.front()].param.options());
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
    b.work = b.comm->all_reduce_async(b.flat);
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
  for (auto& b : buckets_) LOOM_TRY(b->work.wait());
  return Status::success();
}

}  // namespace loom::runtime
