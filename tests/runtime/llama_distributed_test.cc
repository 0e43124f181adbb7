// Llama tiny (grouped-query attention, rotary positions, SwiGLU, RMSNorm) under dp, tp, sp, pp,
// zero and recomputation equals one device: ranks as threads over the local backend, 5 steps;
// losses and every parameter piece against the single-device run, and the per-op oracle. SGD, as
// in distributed_test.cc: linear in the gradient, so held to tests/support/tolerance.h's tight
// bounds; AdamW turns a gradient that cancels to rounding noise into a whole step.
#include "tests/runtime/local_ranks.h"

namespace loom {
namespace {

constexpr int kSteps = 5;

Config config(const std::vector<std::string>& overrides) {
  const char* yaml = R"(run: {seed: 7, steps: 5}
model: {type: llama, preset: tiny, args: {rope_theta: 500.0, norm_eps: 1.0e-6}}
batch: {global: 4, micro: 2}
optimizer: {type: sgd, lr: 0.3, momentum: 0.9, weight_decay: 0.01, clip_grad_norm: 1.0}
comm: {timeout_s: 60}
)";
  auto c = parse_config(yaml, "llama.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

void expect_equal_to_single_device(const std::vector<std::string>& overrides, int world_size) {
  static const testing_support::Reference ref =
      testing_support::train_single_device(config({}), kSteps);
  testing_support::expect_equal_to_single_device(ref, config(overrides), world_size, {});
}

TEST(LlamaLocalRanks, Dp2) { expect_equal_to_single_device({"parallel.dp=2"}, 2); }
// tp 2 splits the 2 kv heads with their query heads; tp 4 repeats each kv head on 2 ranks.
TEST(LlamaLocalRanks, Tp2) { expect_equal_to_single_device({"parallel.tp=2"}, 2); }
TEST(LlamaLocalRanks, Tp4SharesKvHeads) { expect_equal_to_single_device({"parallel.tp=4"}, 4); }
TEST(LlamaLocalRanks, Tp2Sp) {
  expect_equal_to_single_device({"parallel.tp=2", "parallel.sp=true"}, 2);
}
TEST(LlamaLocalRanks, Pp2ZeroBubble) {
  expect_equal_to_single_device({"parallel.pp=2", "parallel.schedule=zb-h1"}, 2);
}
TEST(LlamaLocalRanks, Tp2Pp2) {
  expect_equal_to_single_device({"parallel.tp=2", "parallel.pp=2"}, 4);
}
TEST(LlamaLocalRanks, Dp2Zero3SelectiveRecompute) {
  expect_equal_to_single_device(
      {"parallel.dp=2", "parallel.zero=3", "parallel.recompute=selective"}, 2);
}

TEST(LlamaOracle, Tp2Sp) {
  testing_support::expect_ops_correct(config({"parallel.tp=2", "parallel.sp=true"}));
}
TEST(LlamaOracle, Tp4) { testing_support::expect_ops_correct(config({"parallel.tp=4"})); }
TEST(LlamaOracle, Dp2Tp2Pp2) {
  testing_support::expect_ops_correct(
      config({"parallel.dp=2", "parallel.tp=2", "parallel.pp=2", "parallel.sp=true"}));
}

}  // namespace
}  // namespace loom
