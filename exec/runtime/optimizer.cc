#include "exec/runtime/optimizer.h"

#include <ATen/ATen.h>

#include <cmath>

namespace loom::runtime {

Optimizer::Optimizer(OptimizerConfig config, std::vector<at::Tensor> params,
                     std::vector<bool> decay)
    : config_(std::move(config)), params_(std::move(params)), decay_(std::move(decay)) {
  for (const auto& p : params_) {
    exp_avg_.push_back(at::zeros_like(p));
    if (config_.type == "adamw") exp_avg_sq_.push_back(at::zeros_like(p));
  }
}

void Optimizer::step(double lr) {
  at::NoGradGuard no_grad;
  ++t_;
  const double wd = config_.weight_decay;
  if (config_.type == "adamw") {
    const double b1 = config_.betas[0], b2 = config_.betas[1];
    const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t_));
    const double bc2_sqrt = std::sqrt(1.0 - std::pow(b2, static_cast<double>(t_)));
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor& p = params_[i];
      const at::Tensor& g = p.grad();
      if (!g.defined()) continue;
      if (decay_[i] && wd != 0) p.mul_(1.0 - lr * wd);
      exp_avg_[i].mul_(b1).add_(g, 1.0 - b1);
      exp_avg_sq_[i].mul_(b2).addcmul_(g, g, 1.0 - b2);
      at::Tensor denom = (exp_avg_sq_[i].sqrt() / bc2_sqrt).add_(config_.eps);
      p.addcdiv_(exp_avg_[i], denom, -lr / bc1);
    }
    return;
  }
  for (size_t i = 0; i < params_.size(); ++i) {  // sgd
    at::Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    at::Tensor g = p.grad();
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
  std::vector<at::Tensor> norms;
  for (const auto& p : params)
    if (p.grad().defined()) norms.push_back(p.grad().norm());
  if (norms.empty()) return 0.0;
  double n = at::stack(norms).norm().item<double>();
  return n * n;
}

void clip_gradients(const std::vector<at::Tensor>& params, double total_norm, double max_norm) {
  if (max_norm <= 0) return;
  const double coef = max_norm / (total_norm + 1e-6);
  if (coef >= 1.0) return;
  at::NoGradGuard no_grad;
  for (const auto& p : params)
    if (p.grad().defined()) p.grad().mul_(coef);
}

}  // namespace loom::runtime
