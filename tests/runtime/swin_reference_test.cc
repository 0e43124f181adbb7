// Swin tiny in loom against the independent plain-LibTorch Swin: same weights, same images.
#include "tests/reference/swin_reference.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>

#include "launch/planned_trainer.h"
#include "models/swin.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"

namespace loom {
namespace {

constexpr double kTolerance = 1e-5;

double max_rel_error(const at::Tensor& a, const at::Tensor& b) {
  double scale = std::max(b.abs().max().item<double>(), 1e-12);
  return (a - b).abs().max().item<double>() / scale;
}

// Softmax ignores a shift shared by all keys, so the key bias's gradient is zero up to rounding.
bool key_bias(const std::string& name) { return name.find("attn.k.b") != std::string::npos; }

void expect_swin_matches_reference(const std::vector<std::string>& overrides, int64_t batch) {
  std::vector<std::string> all = {"model.type=swin", "model.preset=tiny",
                                  "batch.global=" + std::to_string(batch),
                                  "batch.micro=" + std::to_string(batch), "run.seed=3"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  auto config = parse_config("", "swin.yaml", all);
  ASSERT_TRUE(config.ok()) << config.error().message;
  auto spec = models::swin_spec(*config);
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  auto trainer = launch::create_trainer(*config);
  ASSERT_TRUE(trainer.ok()) << trainer.error().message;
  runtime::Executor& exec = (*trainer)->executor();
  const graph::Graph& g = (*trainer)->graph();

  // The reference reads copies of loom's initial weights as its own leaves.
  std::map<std::string, torch::Tensor> leaves;
  for (const graph::SubTensor& piece : exec.parameter_pieces()) {
    const std::string& name = g.tensor(piece.tensor).name;
    leaves[name] = exec.parameter(name).detach().clone().requires_grad_(true);
  }
  reference::Swin ref({spec->image, spec->channels, spec->patch, spec->embed, spec->window,
                       spec->mlp_ratio, spec->classes, spec->depths, spec->heads},
                      [&](const std::string& name) {
                        auto it = leaves.find(name);
                        EXPECT_TRUE(it != leaves.end()) << "no loom parameter " << name;
                        return it->second;
                      });

  torch::manual_seed(11);
  torch::Tensor images = torch::randn({batch, spec->channels, spec->image, spec->image});
  torch::Tensor labels = torch::randint(0, spec->classes, {batch}, torch::kLong);
  auto sums = exec.run(
      {{{g.find_tensor("images")->value(), images}, {g.find_tensor("labels")->value(), labels}}},
      1.0);
  ASSERT_TRUE(sums.ok()) << sums.error().message;
  at::Tensor loss = at::scalar_tensor(sums->loss, at::kDouble);
  torch::Tensor ref_loss = ref.loss(images, labels);
  ref_loss.backward();
  EXPECT_LE(max_rel_error(loss, ref_loss), kTolerance)
      << loss.item<double>() << " vs " << ref_loss.item<double>();

  ASSERT_EQ(leaves.size(), exec.parameters().size());
  int64_t elements = 0;
  for (const auto& [name, leaf] : leaves) {
    at::Tensor grad = exec.parameter(name).grad();
    ASSERT_TRUE(grad.defined()) << name;
    ASSERT_TRUE(leaf.grad().defined()) << name;
    if (key_bias(name)) {
      EXPECT_LT(grad.abs().max().item<double>(), 1e-6) << name;
      EXPECT_LT(leaf.grad().abs().max().item<double>(), 1e-6) << name;
    } else {
      EXPECT_GT(leaf.grad().abs().max().item<double>(), 0.0) << name;
      EXPECT_LE(max_rel_error(grad, leaf.grad()), kTolerance) << name;
    }
    elements += leaf.numel();
  }
  EXPECT_EQ(elements, spec->parameter_count());
}

// Tiny: 16 x 16 tokens in windows of 4, then 8 x 8: both stages have shifted windows and masks.
TEST(SwinReference, TinyForwardLossAndEveryGradientMatch) { expect_swin_matches_reference({}, 3); }

// Three stages; the last one's resolution (4) equals the window, so it neither shifts nor masks.
TEST(SwinReference, WindowAsLargeAsTheLastStageStopsShifting) {
  expect_swin_matches_reference({"model.args.depths=2,2,2", "model.args.heads=2,2,4"}, 2);
}

}  // namespace
}  // namespace loom
