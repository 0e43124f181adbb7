#include "exec/runtime/kernels.h"

#include <cmath>

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>

namespace loom::runtime {
namespace {

using graph::Op;
using Tensors = std::vector<at::Tensor>;

Tensors embedding(const Op&, const Tensors& in) { return {at::embedding(in[1], in[0])}; }

Tensors add_position(const Op&, const Tensors& in) { return {in[0] + in[1]}; }

Tensors add_tensors(const Op&, const Tensors& in) { return {in[0] + in[1]}; }

Tensors gelu(const Op&, const Tensors& in) { return {at::gelu(in[0])}; }

Tensors layer_norm(const Op& op, const Tensors& in) {
  double eps = op.attrs().get_or<double>("eps", 1e-5);
  return {at::layer_norm(in[0], {in[0].size(-1)}, in[1], in[2], eps)};
}

Tensors linear(const Op&, const Tensors& in) { return {at::linear(in[0], in[1])}; }

Tensors bias_add(const Op&, const Tensors& in) { return {in[0] + in[1]}; }

// Causal attention over [b, s, h*d] pieces; the head count is local (hidden piece / d).
Tensors attention(const Op& op, const Tensors& in) {
  const int64_t d = op.attrs().get<int64_t>("d");
  const at::Tensor& q = in[0];
  const int64_t b = q.size(0), s = q.size(1), t = in[1].size(1), hd = q.size(2);
  const int64_t h = hd / d;
  auto heads = [&](const at::Tensor& x, int64_t len) { return x.view({b, len, h, d}).transpose(1, 2); };
  at::Tensor qh = heads(q, s), kh = heads(in[1], t), vh = heads(in[2], t);
  at::Tensor scores = at::matmul(qh, kh.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(d)));
  // The causal mask depends only on (s, t): keep one per shape and thread.
  thread_local std::map<std::pair<int64_t, int64_t>, at::Tensor> masks;
  at::Tensor& mask = masks[{s, t}];
  if (!mask.defined()) mask = at::ones({s, t}, q.options().dtype(at::kBool)).triu(t - s + 1);
  scores = scores.masked_fill(mask, -std::numeric_limits<double>::infinity());
  at::Tensor out = at::matmul(at::softmax(scores, -1), vh);
  return {out.transpose(1, 2).reshape({b, s, hd})};
}

// Sum of the token losses of this piece over the full micro-batch's token count.
Tensors cross_entropy(const Op& op, const Tensors& in) {
  const int64_t normalizer = op.attrs().get<int64_t>("normalizer");
  const at::Tensor& logits = in[0];
  at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}),
                                           in[1].reshape({-1}), {}, at::Reduction::Sum);
  return {loss / static_cast<double>(normalizer)};
}

}  // namespace

KernelRegistry KernelRegistry::with_builtin_kernels() {
  KernelRegistry r;
  const std::pair<const char*, Kernel> builtin[] = {
      {"embedding", embedding}, {"add_position", add_position}, {"add", add_tensors},
      {"gelu", gelu},           {"layer_norm", layer_norm},     {"linear", linear},
      {"bias_add", bias_add},   {"attention", attention},       {"cross_entropy", cross_entropy},
  };
  for (const auto& [type, kernel] : builtin) {
    Status s = r.add(type, kernel);
    LOOM_CHECK(s.ok()) << s.error().message;
  }
  return r;
}

Status KernelRegistry::add(const std::string& type, Kernel kernel) {
  if (kernels_.count(type))
    return Error::at(type, "a kernel for op type '" + type + "' is already registered");
  kernels_.emplace(type, std::move(kernel));
  return Status::success();
}

const Kernel* KernelRegistry::find(const std::string& type) const {
  auto it = kernels_.find(type);
  return it == kernels_.end() ? nullptr : &it->second;
}

}  // namespace loom::runtime
