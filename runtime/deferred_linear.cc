#include "runtime/deferred_linear.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "runtime/linear.h"

namespace loom::runtime {
namespace {

// The weight travels as a detached tensor in saved_data: were it an input, autograd would give
// it an edge and a gradient accumulation in the I block.
struct DeferredLinearFn : public torch::autograd::Function<DeferredLinearFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::Tensor x,
                                                c10::optional<at::Tensor> bias, at::Tensor weight,
                                                int64_t stash, int64_t param, int64_t math) {
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["math"] = math;
    ctx->saved_data["stash"] = stash;
    ctx->saved_data["param"] = param;
    // An optional, not an undefined tensor: autograd takes every tensor argument for a variable
    // and fails on an undefined one.
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->save_for_backward({x});
    return {linear_product(x, weight, bias.value_or(at::Tensor()), static_cast<LinearMath>(math))};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor weight = ctx->saved_data["weight"].toTensor();
    const at::Tensor& g = grads[0];
    const auto math = static_cast<LinearMath>(ctx->saved_data["math"].toInt());
    at::Tensor gx, gb;
    if (ctx->needs_input_grad(0)) gx = linear_input_grad(g, weight, math);
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(1))
      gb = g.reshape({-1, g.size(-1)}).sum(0);
    auto* stash = reinterpret_cast<WeightGradStash*>(ctx->saved_data["stash"].toInt());
    stash->add({ctx->saved_data["param"].toInt(), x, g, math});
    return {gx, gb, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor deferred_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           WeightGradStash& stash, int64_t param, LinearMath math) {
  const c10::optional<at::Tensor> b =
      bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt;
  return DeferredLinearFn::apply(x, b, weight.detach(), reinterpret_cast<int64_t>(&stash), param,
                                 static_cast<int64_t>(math))[0];
}

std::map<int64_t, at::Tensor> WeightGradStash::take_weight_grads() {
  std::map<int64_t, at::Tensor> out;
  for (const Entry& e : entries_) {
    // gᵀ·x over every leading dimension: [out, rows] x [rows, in], in the compute dtype as
    // autograd computes it, then summed in float32.
    at::Tensor gw = linear_weight_grad(e.grad_output, e.input, e.math).to(at::kFloat);
    auto it = out.find(e.param);
    if (it == out.end())
      out.emplace(e.param, std::move(gw));
    else
      it->second.add_(gw);
  }
  entries_.clear();
  return out;
}

}  // namespace loom::runtime
