// The Evoformer tiny preset in loom against an independent plain-LibTorch Evoformer
// (tests/reference/evoformer_reference.h): same weights, same synthetic features; the loss and
// the gradient of every parameter agree.
#include "tests/reference/evoformer_reference.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "launch/planned_trainer.h"
#include "models/evoformer.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"

namespace loom {
namespace {

constexpr double kTolerance = 1e-5;

double max_rel_error(const at::Tensor& a, const at::Tensor& b) {
  double scale = std::max(b.abs().max().item<double>(), 1e-12);
  return (a - b).abs().max().item<double>() / scale;
}

// The MSA row attention's pair bias is a projection without bias of the normalised pair, so the
// norm's shift adds the same value to every key's score: its gradient is rounding noise.
bool shift_only(const std::string& name) {
  return name.find("msa_row.pair_ln.b") != std::string::npos;
}

TEST(EvoformerReference, ForwardLossAndEveryGradientMatch) {
  const int64_t batch = 2;  // one micro-batch of 2 samples
  auto config = parse_config(
      "run: {seed: 11}\nmodel: {type: evoformer, preset: tiny}\nbatch: {global: 2, micro: 2}\n",
      "evo.yaml", {});
  ASSERT_TRUE(config.ok()) << config.error().message;
  auto spec = models::evoformer_spec(*config);
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  auto trainer = launch::create_trainer(*config);
  ASSERT_TRUE(trainer.ok()) << trainer.error().message;
  runtime::Executor& exec = (*trainer)->executor();
  const graph::Graph* g = &(*trainer)->graph();

  std::map<std::string, torch::Tensor> weights;
  for (const auto& t : g->tensors())
    if (t.role == graph::TensorRole::kParameter)
      weights[t.name] = exec.parameter(t.name).detach().clone().requires_grad_(true);
  const models::EvoformerSpec& s = *spec;
  reference::Evoformer ref({s.blocks, s.c_m, s.c_z, s.msa_heads, s.msa_head_dim, s.pair_heads,
                            s.pair_head_dim, s.bins, s.ln_eps},
                           weights);

  torch::manual_seed(5);
  torch::Tensor msa = torch::randn({batch, s.seqs, s.residues, s.msa_features});
  torch::Tensor pair = torch::randn({batch, s.residues, s.residues, s.pair_features});
  torch::Tensor targets = torch::randint(0, s.bins, {batch, s.residues, s.residues}, torch::kLong);
  auto sums = exec.run({{{g->find_tensor("msa_feat")->value(), msa},
                         {g->find_tensor("pair_feat")->value(), pair},
                         {g->find_tensor("targets")->value(), targets}}},
                       1.0);
  ASSERT_TRUE(sums.ok()) << sums.error().message;
  at::Tensor loss = at::scalar_tensor(sums->loss, at::kDouble);
  torch::Tensor ref_loss = ref.loss(msa, pair, targets);
  ref_loss.backward();
  EXPECT_LE(max_rel_error(loss, ref_loss), kTolerance)
      << loss.item<double>() << " vs " << ref_loss.item<double>();

  int checked = 0;
  for (auto& [name, w] : ref.params()) {
    at::Tensor grad = exec.parameter(name).grad();
    ASSERT_TRUE(grad.defined()) << name;
    ASSERT_TRUE(w.grad().defined()) << name << " is not used by the reference";
    if (shift_only(name)) {
      // Softmax ignores a shift shared by all keys: both gradients are zero up to rounding.
      EXPECT_LT(grad.abs().max().item<double>(), 1e-6) << name;
      EXPECT_LT(w.grad().abs().max().item<double>(), 1e-6) << name;
    } else {
      // Every gradient carries signal: a parameter the loss ignored would compare 0 with 0.
      EXPECT_GT(w.grad().abs().max().item<double>(), 1e-6) << name;
      EXPECT_LE(max_rel_error(grad, w.grad()), kTolerance) << name;
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(exec.parameters().size()));
}

}  // namespace
}  // namespace loom
