// Multi-rank Evoformer training equals one device: the tiny preset under dp2, pp2, tp2, DAP2, DAP4
// (ranks as threads over the local backend), 5 steps of the Trainer on its seeded synthetic
// features; every rank's losses and every parameter piece against the single-device run.
#include "tests/runtime/local_ranks.h"

namespace loom {
namespace {

constexpr int kSteps = 5;

Config config(const std::vector<std::string>& overrides) {
  const char* yaml = R"(run: {seed: 3}
model: {type: evoformer, preset: tiny}
batch: {global: 4, micro: 2}
optimizer: {type: sgd, lr: 0.2, momentum: 0.9}
comm: {timeout_s: 60}
)";
  auto c = parse_config(yaml, "evo.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

// The shift of the norm before the MSA row attention's pair bias moves every key's score alike,
// which softmax ignores: its gradient is rounding noise (see evoformer_reference_test), summed
// in another order by a split.
const std::vector<std::string> kNoise = {"msa_row.pair_ln.b"};

void expect_equal_to_single_device(const std::vector<std::string>& overrides, int world_size,
                                   const std::vector<std::string>& optimizer = {}) {
  static std::map<std::vector<std::string>, testing_support::Reference> cache;
  auto it = cache.find(optimizer);
  if (it == cache.end())
    it = cache.emplace(optimizer, testing_support::train_single_device(config(optimizer), kSteps))
             .first;
  std::vector<std::string> all = overrides;
  all.insert(all.end(), optimizer.begin(), optimizer.end());
  testing_support::expect_equal_to_single_device(it->second, config(all), world_size, kNoise);
}

TEST(EvoformerLocalRanks, Dp2) { expect_equal_to_single_device({"parallel.dp=2"}, 2); }
TEST(EvoformerLocalRanks, Pp2) { expect_equal_to_single_device({"parallel.pp=2"}, 2); }
// Megatron-style tensor parallelism on the linears' hints (the axial attention cores replicated).
TEST(EvoformerLocalRanks, Tp2) {
  expect_equal_to_single_device({"parallel.policy=tp", "parallel.tp=2"}, 2);
}
TEST(EvoformerLocalRanks, Dap2) {
  expect_equal_to_single_device({"parallel.policy=dap", "parallel.tp=2"}, 2);
}
TEST(EvoformerLocalRanks, Dap4) {
  expect_equal_to_single_device({"parallel.policy=dap", "parallel.tp=4"}, 4);
}
TEST(EvoformerLocalRanks, Dp2Dap2) {
  expect_equal_to_single_device({"parallel.policy=dap", "parallel.dp=2", "parallel.tp=2"}, 4);
}

// Recomputation: the axial attentions alone (selective), or each Evoformer block (full), also
// with DAP's all-to-alls inside the recomputed blocks.
// parallel.zero 3, with DAP: the parameters stored split over the data-parallel and DAP ranks.
TEST(EvoformerZero3, Dp2) {
  expect_equal_to_single_device({"parallel.dp=2", "parallel.zero=3"}, 2);
}
TEST(EvoformerZero3, Dp2Dap2) {
  expect_equal_to_single_device(
      {"parallel.dp=2", "parallel.policy=dap", "parallel.tp=2", "parallel.zero=3"}, 4);
}

TEST(EvoformerRecompute, Full) { expect_equal_to_single_device({"parallel.recompute=full"}, 1); }
TEST(EvoformerRecompute, Selective) {
  expect_equal_to_single_device({"parallel.recompute=selective"}, 1);
}
TEST(EvoformerRecompute, FullDap2) {
  expect_equal_to_single_device({"parallel.recompute=full", "parallel.policy=dap", "parallel.tp=2"},
                                2);
}

// Before any communication: every sub-operator of the DAP 4 and tp 2 plans computes exactly the
// piece of the single-device run it claims (the per-op oracle).
TEST(EvoformerOracle, EverySubOperatorOfDapAndTpIsExact) {
  testing_support::expect_ops_correct(config({"parallel.policy=dap", "parallel.tp=4"}));
  testing_support::expect_ops_correct(config({"parallel.policy=tp", "parallel.tp=2"}));
}

// AdamW with gradient clipping: Adam's sign-like update gets its own bound (tolerance.h).
TEST(EvoformerLocalRanks, Dap4AdamW) {
  expect_equal_to_single_device(
      {"parallel.policy=dap", "parallel.tp=4"}, 4,
      {"optimizer.type=adamw", "optimizer.lr=0.003", "optimizer.clip_grad_norm=0.5"});
}

}  // namespace
}  // namespace loom
