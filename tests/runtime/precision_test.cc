// run.precision=bf16: matrix work and activations in bfloat16, master weights, gradients and
// optimizer state in float32. Each model trains in bf16 as fp32 does (its losses follow the fp32
// curve); a parallel bf16 run equals the single-device bf16 run within what bf16 rounding allows.
#include <algorithm>

#include "launch/planned_trainer.h"
#include "tests/runtime/local_ranks.h"
#include "tests/support/train_losses.h"

namespace loom {
namespace {

Config config(const std::string& yaml, const std::vector<std::string>& overrides) {
  auto c = parse_config(yaml, "precision.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

// bf16 keeps 8 significant bits (relative rounding 2^-9 = 0.2 %); a loss is a mean over many
// token losses whose roundings mostly cancel, and the parameters stay float32, so the bf16
// curve follows the fp32 one to a fraction of a percent. Each model's bound is 3-5x what it
// measured over 30 steps. Training must move the fp32 curve away from an untrained run's (lr 1e-12,
// the same batches) by twice the bound, so a bf16 run that does not train (updates lost in bf16
// master weights, gradients dropped in the cast) fails.
void expect_bf16_follows_fp32(const std::string& yaml, int steps, double rel) {
  at::set_num_threads(1);
  const std::vector<double> fp32 = testing_support::train_losses(config(yaml, {}), steps);
  const std::vector<double> bf16 =
      testing_support::train_losses(config(yaml, {"run.precision=bf16"}), steps);
  ASSERT_EQ(fp32.size(), static_cast<size_t>(steps));
  ASSERT_EQ(bf16.size(), static_cast<size_t>(steps));
  const std::vector<double> untrained =
      testing_support::train_losses(config(yaml, {"optimizer.lr=1e-12"}), steps);
  ASSERT_EQ(untrained.size(), static_cast<size_t>(steps));
  double learned = 0;
  for (int i = 0; i < steps; ++i)
    learned = std::max(learned, std::abs(fp32[i] - untrained[i]) / fp32[i]);
  EXPECT_GT(learned, 2 * rel) << "training barely moves the fp32 losses";
  double differs = 0;
  for (int i = 0; i < steps; ++i) {
    differs = std::max(differs, std::abs(bf16[i] - fp32[i]) / fp32[i]);
    EXPECT_LE(std::abs(bf16[i] - fp32[i]) / fp32[i], rel)
        << "step " << i + 1 << ": bf16 " << bf16[i] << " vs fp32 " << fp32[i];
  }
  // bf16 really ran: its rounding (2^-9 per value) shows in the losses, which a run that
  // ignored run.precision would repeat bit for bit (measured at least 4e-4 on these models).
  EXPECT_GT(differs, 1e-5) << "the bf16 losses equal the fp32 ones: bf16 did not run";
}

TEST(Bf16, GptTinyFollowsFp32) {
  expect_bf16_follows_fp32(R"(run: {seed: 3}
model: {type: gpt, preset: tiny}
batch: {global: 8, micro: 4}
optimizer: {type: adamw, lr: 0.003, weight_decay: 0.01, clip_grad_norm: 1.0}
)",
                           30, 2e-3);  // measured 0.04 %; training moves it by > 40 %
}

TEST(Bf16, SwinTinyFollowsFp32) {
  expect_bf16_follows_fp32(R"(run: {seed: 5}
model: {type: swin, preset: tiny}
batch: {global: 4, micro: 2}
optimizer: {type: adamw, lr: 0.003, clip_grad_norm: 1.0}
)",
                           30, 2e-2);  // measured 0.48 %; training moves it by 12 %
}

TEST(Bf16, EvoformerTinyFollowsFp32) {
  expect_bf16_follows_fp32(R"(run: {seed: 3}
model: {type: evoformer, preset: tiny}
batch: {global: 4, micro: 2}
optimizer: {type: adamw, lr: 0.003}
)",
                           30, 4e-3);  // measured 0.14 %; training moves it by 1.0 %
}

// tp2 x pp2 in bf16 against one device in bf16, under the bf16 terms of the tolerance policy
// (tests/support/tolerance.h: the plan rounds its partial sums to bf16 where one device rounds
// the whole sum once). SGD, so a parameter's travel follows its gradients linearly.
TEST(Bf16, Tp2Pp2ZbH1Pp2AndZero3Dp2EqualOneDevice) {
  const std::string yaml = R"(run: {seed: 3, precision: bf16}
model: {type: gpt, preset: tiny}
batch: {global: 8, micro: 2}
optimizer: {type: sgd, lr: 0.3, momentum: 0.9, weight_decay: 0.01, clip_grad_norm: 1.0}
comm: {timeout_s: 60}
)";
  at::set_num_threads(1);
  const testing_support::Reference ref = testing_support::train_single_device(config(yaml, {}), 6);
  testing_support::expect_equal_to_single_device(
      ref, config(yaml, {"parallel.tp=2", "parallel.pp=2"}), 4, {"attn.k.b"});
  // The split backward: W blocks add the bf16 weight products to the float32 masters directly.
  testing_support::expect_equal_to_single_device(
      ref, config(yaml, {"parallel.pp=2", "parallel.schedule=zb-h1"}), 2, {"attn.k.b"});
  // zero 3: the shards' bf16 copies are gathered and their gradients reduce-scattered in bf16
  // (two replicas' sums rounded once more, like a tp partial sum), then cast to the masters.
  testing_support::expect_equal_to_single_device(
      ref, config(yaml, {"parallel.dp=2", "parallel.zero=3"}), 2, {"attn.k.b"});
}

}  // namespace
}  // namespace loom
