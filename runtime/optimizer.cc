#include "runtime/optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

namespace loom::runtime {

namespace {

// The tensors of one update, gathered once per step: a multi-tensor op runs over each list in
// one call instead of one dispatch per parameter.
struct Lists {
  std::vector<at::Tensor> params, grads, exp_avg, exp_avg_sq, steps;
};

// LibTorch's fused AdamW (one kernel over every tensor of a list, CPU and CUDA) takes the same
// dtype for a parameter and its gradient; on these CPUs it took 0.73-0.94x the time of loom's
// own one-pass loop, which it replaced (bench/RESULTS.md, "AdamW on the CPU").
bool fusable(const Lists& l) {
  for (size_t i = 0; i < l.params.size(); ++i)
    if (l.grads[i].scalar_type() != l.params[i].scalar_type() ||
        l.grads[i].device() != l.params[i].device())
      return false;
  return true;
}

}  // namespace

Optimizer::Optimizer(OptimizerKind kind, OptimizerConfig config, std::vector<at::Tensor> params,
                     std::vector<bool> decay, std::vector<std::pair<int64_t, int64_t>> owned)
    : kind_(kind),
      config_(std::move(config)),
      params_(std::move(params)),
      decay_(std::move(decay)),
      owned_(std::move(owned)) {
  if (owned_.empty())
    for (const at::Tensor& p : params_) owned_.emplace_back(0, p.numel());
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto [begin, end] = owned_[i];
    at::Tensor state;
    if (end > begin) state = at::zeros_like(target(i));
    exp_avg_.push_back(state);
    if (kind_ == OptimizerKind::kAdamw)
      exp_avg_sq_.push_back(end > begin ? at::zeros_like(state) : state);
  }
}

at::Tensor Optimizer::target(size_t i) const {
  const at::Tensor& p = params_[i];
  const auto [begin, end] = owned_[i];
  if (begin == 0 && end == p.numel()) return p;
  return p.detach().view({-1}).narrow(0, begin, end - begin);
}

at::Tensor Optimizer::target_grad(size_t i) const {
  const at::Tensor& g = params_[i].grad();
  const auto [begin, end] = owned_[i];
  if (!g.defined() || (begin == 0 && end == g.numel())) return g;
  return g.reshape({-1}).narrow(0, begin, end - begin);
}

void Optimizer::step(double lr) {
  at::NoGradGuard no_grad;
  ++t_;
  switch (kind_) {
    case OptimizerKind::kAdamw:
      adamw_step(lr);
      return;
    case OptimizerKind::kSgd:
      sgd_step(lr);
      return;
  }
}

void Optimizer::adamw_step(double lr) {
  const double wd = config_.weight_decay;
  const double b1 = config_.betas[0], b2 = config_.betas[1];
  // Parameters that decay and those that do not are updated as two lists (decay differs).
  Lists groups[2];
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor g = target_grad(i);
    if (!g.defined() || !exp_avg_[i].defined()) continue;
    Lists& l = groups[decay_[i] && wd != 0 ? 1 : 0];
    l.params.push_back(target(i));
    l.grads.push_back(g);
    l.exp_avg.push_back(exp_avg_[i]);
    l.exp_avg_sq.push_back(exp_avg_sq_[i]);
  }
  for (int decays = 0; decays < 2; ++decays) {
    Lists& l = groups[decays];
    if (l.params.empty()) continue;
    const double decay = decays ? wd : 0.0;
    if (fusable(l)) {
      // The fused kernel reads the step count from a tensor per parameter (bias correction).
      at::Tensor step =
          at::full({}, static_cast<double>(t_), l.params.front().options().dtype(at::kFloat));
      l.steps.assign(l.params.size(), step);
      at::_fused_adamw_(l.params, l.grads, l.exp_avg, l.exp_avg_sq, /*max_exp_avg_sqs=*/{}, l.steps,
                        lr, b1, b2, decay, config_.eps, /*amsgrad=*/false,
                        /*maximize=*/false);
      continue;
    }
    const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t_));
    const double bc2_sqrt = std::sqrt(1.0 - std::pow(b2, static_cast<double>(t_)));
    if (decay != 0) at::_foreach_mul_(l.params, 1.0 - lr * decay);
    at::_foreach_mul_(l.exp_avg, b1);
    at::_foreach_add_(l.exp_avg, l.grads, 1.0 - b1);
    at::_foreach_mul_(l.exp_avg_sq, b2);
    at::_foreach_addcmul_(l.exp_avg_sq, l.grads, l.grads, 1.0 - b2);
    std::vector<at::Tensor> denom = at::_foreach_sqrt(l.exp_avg_sq);
    at::_foreach_div_(denom, bc2_sqrt);
    at::_foreach_add_(denom, config_.eps);
    at::_foreach_addcdiv_(l.params, l.exp_avg, denom, -lr / bc1);
  }
}

void Optimizer::sgd_step(double lr) {
  const double wd = config_.weight_decay;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor p = target(i);
    at::Tensor g = target_grad(i);
    if (!g.defined() || !exp_avg_[i].defined()) continue;
    if (decay_[i] && wd != 0) g = g.add(p, wd);
    if (config_.momentum != 0) {
      if (t_ == 1)
        exp_avg_[i].copy_(g);
      else
        exp_avg_[i].mul_(config_.momentum).add_(g);
      g = exp_avg_[i];
    }
    p.add_(g, -lr);
  }
}

double grad_norm_squared(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return 0.0;
  double n = at::stack(at::_foreach_norm(grads)).norm().item<double>();
  return n * n;
}

void clip_gradients(const std::vector<at::Tensor>& params, double total_norm, double max_norm) {
  if (max_norm <= 0) return;
  const double coef = max_norm / (total_norm + 1e-6);
  if (coef >= 1.0) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (!grads.empty()) at::_foreach_mul_(grads, coef);
}

}  // namespace loom::runtime
