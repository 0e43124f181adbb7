// The cross-entropy kernel a fused loss chain runs (lower/fusion.h) against the vocabulary-group
// chain it replaces (group_logsumexp, logsumexp, pick, nll): the same loss and logit gradients.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "graph/builder.h"
#include "runtime/kernels.h"

namespace loom::runtime {
namespace {

constexpr int64_t kBatch = 3, kSeq = 5, kVocab = 96, kGroups = 4;

// Logits [b s v] and targets [b s] read by the four-op chain, or by one cross_entropy op with
// the same normalizer.
graph::Graph loss_graph(const graph::OpRegistry& ops, DType dtype, bool fused) {
  graph::GraphBuilder b(ops, "loss");
  TensorId logits = b.input("logits", {kBatch, kSeq, kVocab}, dtype);
  TensorId targets = b.input("targets", {kBatch, kSeq}, DType::kInt64, kVocab);
  const graph::Attrs groups{{"v", kVocab / kGroups}};
  const graph::Attrs normalizer{{"normalizer", kBatch * kSeq}};
  if (fused) {
    b.set_loss(b.op1("cross_entropy", "loss", {logits, targets}, normalizer));
  } else {
    TensorId group_lse = b.op1("group_logsumexp", "group_lse", {logits}, groups);
    TensorId lse = b.op1("logsumexp", "lse", {group_lse});
    TensorId target = b.op1("pick", "target", {logits, targets}, groups);
    b.set_loss(b.op1("nll", "loss", {lse, target}, normalizer));
  }
  auto g = b.finish();
  EXPECT_TRUE(g.ok()) << g.error().message;
  return std::move(g).value();
}

// The loss and the logits' gradient of one way through, from the same logits: the graph's ops
// in order, each by its registered kernel.
std::pair<at::Tensor, at::Tensor> run(const graph::Graph& g, const at::Tensor& logits,
                                      const at::Tensor& targets) {
  const KernelRegistry kernels = KernelRegistry::with_builtin_kernels();
  std::vector<at::Tensor> values(g.tensors().size());
  at::Tensor x = logits.detach().clone().requires_grad_(true);
  values[static_cast<size_t>(g.find_tensor("logits")->value())] = x;
  values[static_cast<size_t>(g.find_tensor("targets")->value())] = targets;
  for (const graph::Op& op : g.ops()) {
    std::vector<at::Tensor> in;
    for (const auto& piece : op.inputs)
      in.push_back(values[static_cast<size_t>(piece.tensor.value())]);
    values[static_cast<size_t>(op.outputs[0].tensor.value())] =
        (*kernels.find(op.type()))(KernelContext{g, op}, in)[0];
  }
  at::Tensor loss = values[static_cast<size_t>(g.loss().value())];
  loss.backward();
  return {loss.detach(), x.grad()};
}

// Both compute log-sum-exp with the maximum taken out, the chain in two levels (groups, then
// over groups), LibTorch's log-softmax in one: they differ in summation order only, a few
// float32 ulps of the log-sum-exp (~6 here: ulp 4.8e-7), so 1e-5 relative on the loss and on
// each gradient element (probability - one-hot, over the token count; atol for elements near 0).
// Under bf16 both compute in float32 from the same bf16 logits, but the chain's logit gradient
// is the sum of two bf16 gradients (the log-sum-exp's and the pick's, each rounded) and the
// fused one a single float32 value rounded once: up to one bf16 ulp apart (2^-7 relative).
TEST(LossFusion, CrossEntropyEqualsTheVocabularyGroupChain) {
  const auto ops = graph::OpRegistry::with_builtin_ops();
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    at::manual_seed(3);
    const at::ScalarType st = dtype == DType::kFloat32 ? at::kFloat : at::kBFloat16;
    const at::Tensor logits = (at::randn({kBatch, kSeq, kVocab}) * 3).to(st);
    const at::Tensor targets = at::randint(kVocab, {kBatch, kSeq}, at::kLong);
    const auto [chain_loss, chain_grad] = run(loss_graph(ops, dtype, false), logits, targets);
    const auto [fused_loss, fused_grad] = run(loss_graph(ops, dtype, true), logits, targets);
    const bool bf16 = dtype == DType::kBFloat16;
    const double grad_rtol = bf16 ? 1.0 / 128 : 1e-5;
    EXPECT_EQ(fused_grad.scalar_type(), st);
    EXPECT_TRUE(at::allclose(fused_loss.to(at::kFloat), chain_loss.to(at::kFloat), 1e-5, 0))
        << to_string(dtype) << ": " << fused_loss.item<float>() << " vs "
        << chain_loss.item<float>();
    EXPECT_TRUE(at::allclose(fused_grad.to(at::kFloat), chain_grad.to(at::kFloat), grad_rtol, 1e-8))
        << to_string(dtype) << ": largest difference "
        << (fused_grad.to(at::kFloat) - chain_grad.to(at::kFloat)).abs().max().item<float>();
    // The gradient of a mean cross-entropy: each token's row sums to zero.
    EXPECT_LT(fused_grad.to(at::kFloat).sum(-1).abs().max().item<float>(), bf16 ? 1e-3 : 1e-6);
  }
}

// A target whose probability underflows float32 (its logit 200 below the others): the loss is
// still the exact log-sum-exp minus the target's logit, log(95 + e^-200) + 200 = 204.554 (a
// float32 ulp there is 1.5e-5), not the -log(0) = inf or a clamped value.
TEST(LossFusion, CrossEntropyOfAnUnderflowedTargetIsExact) {
  const auto ops = graph::OpRegistry::with_builtin_ops();
  at::Tensor logits = at::zeros({kBatch, kSeq, kVocab});
  const at::Tensor targets = at::zeros({kBatch, kSeq}, at::kLong);
  logits.select(2, 0).fill_(-200.0);
  const auto [loss, grad] = run(loss_graph(ops, DType::kFloat32, true), logits, targets);
  EXPECT_NEAR(loss.item<double>(), std::log(static_cast<double>(kVocab - 1)) + 200.0, 1e-4);
  // Each token's gradient: 1/95 on every other logit and -1 on the target, over 15 tokens.
  EXPECT_NEAR(grad[0][0][0].item<double>(), -1.0 / (kBatch * kSeq), 1e-7);
  EXPECT_NEAR(grad[0][0][1].item<double>(), 1.0 / (kVocab - 1) / (kBatch * kSeq), 1e-8);
}

}  // namespace
}  // namespace loom::runtime
