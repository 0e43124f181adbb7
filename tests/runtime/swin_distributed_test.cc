// Swin tiny under dp, tp, pp and window parallelism equals one device: ranks as threads over the
// local backend, 5 steps; losses and every parameter piece against the single-device run.
#include "tests/runtime/local_ranks.h"

namespace loom {
namespace {

constexpr int kSteps = 5;

Config config(const std::vector<std::string>& overrides) {
  const char* yaml = R"(run: {seed: 5, steps: 5}
model: {type: swin, preset: tiny}
batch: {global: 4, micro: 2}
optimizer: {type: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.01, clip_grad_norm: 1.0}
comm: {timeout_s: 60}
)";
  auto c = parse_config(yaml, "swin.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

void expect_equal_to_single_device(const std::vector<std::string>& overrides, int world_size) {
  static const testing_support::Reference ref =
      testing_support::train_single_device(config({}), kSteps);
  // The key bias cannot change the output (softmax ignores a shift shared by all keys).
  testing_support::expect_equal_to_single_device(ref, config(overrides), world_size, {"attn.k.b"});
}

TEST(SwinLocalRanks, Dp2) { expect_equal_to_single_device({"parallel.dp=2"}, 2); }
TEST(SwinLocalRanks, Tp2) { expect_equal_to_single_device({"parallel.tp=2"}, 2); }
TEST(SwinLocalRanks, Pp2) { expect_equal_to_single_device({"parallel.pp=2"}, 2); }
TEST(SwinLocalRanks, WindowParallel2) {
  expect_equal_to_single_device({"parallel.policy=window", "parallel.tp=2"}, 2);
}
TEST(SwinLocalRanks, WindowParallel2Dp2) {
  expect_equal_to_single_device({"parallel.policy=window", "parallel.tp=2", "parallel.dp=2"}, 4);
}

// Recomputation: window attention alone (selective), or each Swin block (full), also with the
// window split's collectives inside the recomputed blocks.
TEST(SwinRecompute, Full) { expect_equal_to_single_device({"parallel.recompute=full"}, 1); }
TEST(SwinRecompute, Selective) {
  expect_equal_to_single_device({"parallel.recompute=selective"}, 1);
}
TEST(SwinRecompute, FullWindowParallel2) {
  expect_equal_to_single_device(
      {"parallel.recompute=full", "parallel.policy=window", "parallel.tp=2"}, 2);
}

// parallel.zero 3: every parameter, the relative-position bias tables too, stored split over
// the replicas (with window parallelism: over the window ranks as well) and gathered for use.
TEST(SwinZero3, Dp2) { expect_equal_to_single_device({"parallel.dp=2", "parallel.zero=3"}, 2); }
TEST(SwinZero3, Dp2WindowParallel2FullRecompute) {
  expect_equal_to_single_device({"parallel.dp=2", "parallel.policy=window", "parallel.tp=2",
                                 "parallel.zero=3", "parallel.recompute=full"},
                                4);
}

// Window 4: stage 0 (4 x 4 windows) splits windows; stage 1 (2 x 2 windows) cannot, and its
// attention and MLP fall back to the Megatron split.
TEST(SwinLocalRanks, WindowParallel4) {
  expect_equal_to_single_device({"parallel.policy=window", "parallel.tp=4"}, 4);
}
TEST(SwinLocalRanks, WindowParallel2Pp2) {
  expect_equal_to_single_device({"parallel.policy=window", "parallel.tp=2", "parallel.pp=2"}, 4);
}

void expect_ops_correct(const std::vector<std::string>& overrides) {
  testing_support::expect_ops_correct(config(overrides));
}

TEST(SwinOracle, Tp2Pp2) { expect_ops_correct({"parallel.tp=2", "parallel.pp=2"}); }
TEST(SwinOracle, Window4) { expect_ops_correct({"parallel.policy=window", "parallel.tp=4"}); }
TEST(SwinOracle, Dp2Window2Pp2) {
  expect_ops_correct({"parallel.policy=window", "parallel.dp=2", "parallel.tp=2", "parallel.pp=2"});
}

// Window parallelism splits the windows of attention and the image rows around it, and the
// channels where shifted windows mix rows: no op of the first stage holds the full activation.
TEST(SwinWindowPlan, SplitsWindowsRowsAndShiftedChannels) {
  Config c = config({"parallel.policy=window", "parallel.tp=2"});
  auto ops = graph::OpRegistry::with_builtin_ops();
  auto plan = loom::plan::planned_graph(c, testing_support::registries_with(ops), 2);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_TRUE(graph::verify(*plan, ops).ok());
  std::map<std::string, std::string> split_dim;  // op name -> which output dimension is halved
  for (const auto& op : plan->ops()) {
    if (op.layer() != 0 && op.layer() != 1) continue;  // stage 0 of Swin
    const auto& out = op.outputs[0];
    const auto& full = plan->tensor(out.tensor).shape;
    std::string halved;
    for (size_t d = 0; d < full.size(); ++d)
      if (out.ranges[d].size() * 2 == full[d]) halved += std::to_string(d);
    split_dim[op.def->name] = halved;
  }
  EXPECT_EQ(split_dim.at("s0.b0.attn.windows"), "1");  // windows (unshifted: rows of windows)
  EXPECT_EQ(split_dim.at("s0.b0.attn.core"), "1");
  EXPECT_EQ(split_dim.at("s0.b1.attn.windows"), "3");  // shifted: channels
  EXPECT_EQ(split_dim.at("s0.b1.attn.core"), "1");
  EXPECT_EQ(split_dim.at("s0.b1.mlp.fc1.bias"), "1");  // image rows
  EXPECT_EQ(split_dim.at("s0.b1.attn.unwindows"), "3");
}

}  // namespace
}  // namespace loom
