#include "exec/runtime/kernels.h"

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/version.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <tuple>

#include "exec/runtime/kernels_evoformer.h"
#include "exec/runtime/kernels_vision.h"
#include "graph/precision.h"

namespace loom::runtime {
namespace {

using Ctx = KernelContext;
using Tensors = std::vector<at::Tensor>;

// A piece of the vocabulary [v0, v0 + rows) looks up the tokens it holds and gives zero rows
// for the others (Megatron's vocab-parallel embedding): the pieces are partial sums.
// A table lookup whose backward keeps the indices and the table's row count, not the table:
// under parallel.zero 3 the table is a gathered copy that should go once the forward has read it.
struct EmbeddingFn : public torch::autograd::Function<EmbeddingFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::Tensor table, at::Tensor indices) {
    ctx->saved_data["rows"] = table.size(0);
    ctx->save_for_backward({indices});
    return {at::embedding(table, indices)};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor indices = ctx->get_saved_variables()[0];
    return {at::embedding_backward(grads[0], indices, ctx->saved_data["rows"].toInt(),
                                   /*padding_idx=*/-1, /*scale_grad_by_freq=*/false,
                                   /*sparse=*/false),
            at::Tensor()};
  }
};

Tensors embedding(const Ctx& ctx, const Tensors& in) {
  const at::Tensor& tokens = in[0];
  const at::Tensor& table = in[1];
  const int64_t v0 = ctx.op.inputs[1].ranges[0].start;
  if (v0 == 0 && table.size(0) == ctx.full_size(1, 0)) return EmbeddingFn::apply(table, tokens);
  at::Tensor local = tokens - v0;
  at::Tensor outside = (local < 0).logical_or_(local >= table.size(0));
  at::Tensor rows = EmbeddingFn::apply(table, local.masked_fill(outside, 0))[0];
  return {rows.masked_fill(outside.unsqueeze(-1), 0.0)};
}

Tensors add_position(const Ctx&, const Tensors& in) { return {in[0] + in[1]}; }

Tensors add_tensors(const Ctx&, const Tensors& in) { return {in[0] + in[1]}; }

Tensors gelu(const Ctx&, const Tensors& in) { return {at::gelu(in[0])}; }

// In float32 whatever the activations' dtype (the executor hands on the graph's dtype).
Tensors layer_norm(const Ctx& ctx, const Tensors& in) {
  double eps = ctx.op.attrs().get_or<double>("eps", 1e-5);
  return {at::layer_norm(in[0].to(at::kFloat), {in[0].size(-1)}, in[1].to(at::kFloat),
                         in[2].to(at::kFloat), eps)};
}

Tensors linear(const Ctx&, const Tensors& in) { return {at::linear(in[0], in[1])}; }

Tensors bias_add(const Ctx&, const Tensors& in) { return {in[0] + in[1]}; }

// Causal attention over [b, s, h*d] pieces; the head count is local (hidden piece / d). A
// piece of s queries (sequence parallel) sees keys up to its own positions: the last s of t.
Tensors attention(const Ctx& ctx, const Tensors& in) {
  const int64_t d = ctx.op.attrs().get<int64_t>("d");
  const at::Tensor& q = in[0];
  const int64_t b = q.size(0), s = q.size(1), t = in[1].size(1), hd = q.size(2);
  const int64_t h = hd / d;
  auto heads = [&](const at::Tensor& x, int64_t len) {
    return x.view({b, len, h, d}).transpose(1, 2);
  };
  at::Tensor qh = heads(q, s), kh = heads(in[1], t), vh = heads(in[2], t);
  // SDPA where graph::fused_attention says (GPUs; float32 on the CPU), else explicit products.
  if (graph::fused_attention(q.scalar_type() == at::kBFloat16, q.device().is_cuda())) {
    // The fused kernels (flash, memory-efficient) where the LibTorch has them; a query piece
    // that is not the whole sequence passes its mask (SDPA's is_causal aligns top-left): true
    // where a query may see a key. One mask per shape, device and thread.
    thread_local std::map<std::tuple<int64_t, int64_t, std::string>, at::Tensor> visible;
    auto mask = [&]() -> const at::Tensor& {
      at::Tensor& m = visible[{s, t, q.device().str()}];
      if (!m.defined()) m = at::ones({s, t}, q.options().dtype(at::kBool)).tril(t - s);
      return m;
    };
    at::Tensor out = s == t ? at::scaled_dot_product_attention(qh, kh, vh, {}, 0.0, true)
                            : at::scaled_dot_product_attention(qh, kh, vh, mask(), 0.0, false);
    return {out.transpose(1, 2).reshape({b, s, hd})};
  }
  // Scale, scores and causal mask in one batched product: baddbmm adds an additive mask (0 where
  // a query sees a key, -inf elsewhere) to scale * q k^T, and its backward has nothing to do for
  // the mask (a masked_fill's backward is another pass over the s x t scores). One mask per
  // shape, device, dtype and thread.
  thread_local std::map<std::tuple<int64_t, int64_t, std::string, int>, at::Tensor> biases;
  at::Tensor& bias = biases[{s, t, q.device().str(), static_cast<int>(q.scalar_type())}];
  if (!bias.defined())
    bias = at::zeros({s, t}, q.options())
               .masked_fill_(at::ones({s, t}, q.options().dtype(at::kBool)).triu(t - s + 1),
                             -std::numeric_limits<double>::infinity());
  const at::Tensor k3 = kh.reshape({b * h, t, d});
  at::Tensor scores = at::baddbmm(bias, qh.reshape({b * h, s, d}), k3.transpose(1, 2), 1.0,
                                  1.0 / std::sqrt(static_cast<double>(d)));
  // Softmax in float32 whatever the activations' dtype.
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(vh.scalar_type());
  at::Tensor out = at::bmm(probs, vh.reshape({b * h, t, d})).view({b, h, s, d});
  return {out.transpose(1, 2).reshape({b, s, hd})};
}

// Sum of the token losses of this piece over the full micro-batch's token count.
Tensors cross_entropy(const Ctx& ctx, const Tensors& in) {
  const int64_t normalizer = ctx.op.attrs().get<int64_t>("normalizer");
  const at::Tensor logits = in[0].to(at::kFloat);
  at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}),
                                           in[1].reshape({-1}), {}, at::Reduction::Sum);
  return {loss / static_cast<double>(normalizer)};
}

// Log-sum-exp over the last dimension, as at::logsumexp computes it, with a backward that makes
// one buffer: d lse / dx = exp(x - lse), exponentiated and scaled in place. (Autograd's own
// backward allocates the difference, its exponential and their product, each the size of the
// logits: three fresh allocations of the largest tensor of a language model's step.)
struct LogSumExp : public torch::autograd::Function<LogSumExp> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    at::Tensor lse = at::logsumexp(x, -1);
    ctx->save_for_backward({x, lse});
    return lse;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor g = saved[0] - saved[1].unsqueeze(-1);
    g.exp_().mul_(grads[0].unsqueeze(-1));
    return {g};
  }
};

Tensors group_logsumexp(const Ctx& ctx, const Tensors& in) {
  const int64_t v = ctx.op.attrs().get<int64_t>("v");
  const at::Tensor x = in[0].to(at::kFloat);
  return {LogSumExp::apply(x.view({x.size(0), x.size(1), x.size(2) / v, v}))};
}

Tensors logsumexp(const Ctx&, const Tensors& in) {
  return {LogSumExp::apply(in[0].to(at::kFloat))};
}

// The logit of each token's target, where this piece of the vocabulary holds it; else 0.
Tensors pick(const Ctx& ctx, const Tensors& in) {
  const at::Tensor& logits = in[0];
  const int64_t v0 = ctx.op.inputs[0].ranges[2].start;
  const int64_t width = logits.size(2);
  at::Tensor local = in[1] - v0;
  if (v0 == 0 && width == ctx.full_size(0, 2))
    return {logits.gather(-1, local.unsqueeze(-1)).squeeze(-1)};
  at::Tensor inside = (local >= 0).logical_and_(local < width);
  at::Tensor picked = logits.gather(-1, local.clamp(0, width - 1).unsqueeze(-1)).squeeze(-1);
  return {at::where(inside, picked, at::zeros_like(picked))};
}

Tensors nll(const Ctx& ctx, const Tensors& in) {
  const int64_t normalizer = ctx.op.attrs().get<int64_t>("normalizer");
  return {(in[0] - in[1]).sum() / static_cast<double>(normalizer)};
}

}  // namespace

KernelRegistry KernelRegistry::with_builtin_kernels() {
  KernelRegistry r;
  const std::pair<const char*, Kernel> builtin[] = {
      {"embedding", embedding},
      {"add_position", add_position},
      {"add", add_tensors},
      {"gelu", gelu},
      {"layer_norm", layer_norm},
      {"linear", linear},
      {"bias_add", bias_add},
      {"attention", attention},
      {"cross_entropy", cross_entropy},
      {"group_logsumexp", group_logsumexp},
      {"logsumexp", logsumexp},
      {"pick", pick},
      {"nll", nll},
  };
  for (const auto& [type, kernel] : builtin) {
    Status s = r.add(type, kernel);
    LOOM_CHECK(s.ok()) << s.error().message;
  }
  add_evoformer_kernels(r);
  add_vision_kernels(r);
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
