// parallel.policy auto (plan/auto_plan.h): the winner is the plan make_plan makes of its config,
// at least as fast (estimated) as every layout a user could have picked that fits, and within the
// memory limit, with recomputation or ZeRO when the limit requires them.
#include "plan/auto_plan.h"

#include <gtest/gtest.h>

namespace loom::plan {
namespace {

Config config(const std::vector<std::string>& overrides = {}) {
  auto c = parse_config(R"(model: {type: gpt, preset: tiny, args: {layers: 4}}
batch: {global: 16, micro: 2}
optimizer: {type: adamw, lr: 0.001}
cost: {preset: cpu}
parallel: {policy: auto}
)",
                        "auto.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

CostModel cost_of(const Config& c) {
  auto cost = resolve_cost_model(c);
  EXPECT_TRUE(cost.ok());
  return *cost;
}

TEST(AutoPlan, WinnerIsItsOwnPlanAndNoHandLayoutBeatsIt) {
  const Config c = config();
  auto chosen = auto_plan(c, Registries{}, cost_of(c), 4);
  ASSERT_TRUE(chosen.ok()) << chosen.error().message;
  ASSERT_FALSE(chosen->top.empty());
  // The plan handed to loom train is the one of the winner's config, with its figures.
  EXPECT_EQ(chosen->config.parallel.world_size(), 4);
  EXPECT_NE(chosen->config.parallel.policy, "auto");
  auto again = make_plan(chosen->config, Registries{}, cost_of(c), 4);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_DOUBLE_EQ(again->estimate.step_s, chosen->top[0].step_s);
  EXPECT_DOUBLE_EQ(chosen->plan.estimate.step_s, chosen->top[0].step_s);
  for (size_t i = 1; i < chosen->top.size(); ++i)
    EXPECT_LE(chosen->top[0].step_s, chosen->top[i].step_s);
  // Layouts a user might pick, each at the first rung of the ladder that fits.
  for (const std::vector<std::string>& hand :
       {std::vector<std::string>{"parallel.policy=hybrid", "parallel.dp=4"},
        {"parallel.policy=hybrid", "parallel.dp=2", "parallel.tp=2"},
        {"parallel.policy=hybrid", "parallel.dp=2", "parallel.pp=2"},
        {"parallel.policy=hybrid", "parallel.tp=2", "parallel.pp=2", "batch.micro=1"},
        {"parallel.policy=hybrid", "parallel.pp=4", "batch.micro=1"}}) {
    auto got = plan_within_memory(config(hand), Registries{}, cost_of(c), 4);
    ASSERT_TRUE(got.ok()) << got.error().message;
    EXPECT_LE(chosen->top[0].step_s, got->step_s) << got->label;
  }
  EXPECT_GT(chosen->considered, 10);
  EXPECT_NE(describe(*chosen).find("chosen: " + chosen->top[0].label), std::string::npos);
}

// A limit under what every layout needs without recomputation or ZeRO: the winner fits it with
// one of them.
TEST(AutoPlan, TightMemoryTakesRecomputationOrZero) {
  const Config loose = config();
  auto free = auto_plan(loose, Registries{}, cost_of(loose), 4);
  ASSERT_TRUE(free.ok()) << free.error().message;
  // Below the smallest peak of the whole first rung (no recompute, ZeRO 0) over every layout.
  double smallest = 0;
  for (const char* hand : {"parallel.dp=4", "parallel.tp=4", "parallel.pp=4"}) {
    Config c = config({"parallel.policy=hybrid", hand, "batch.micro=1"});
    auto plan = make_plan(c, Registries{}, cost_of(c), 4);
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    const double peak = plan->estimate.max_peak_bytes();
    smallest = smallest == 0 ? peak : std::min(smallest, peak);
  }
  // Just under it: every layout needs a memory feature to fit (0.95: attention keeps little for its
  // backward with the fused kernel, so recomputation frees a few percent of a tiny model's peak).
  const double limit_gb = 0.95 * smallest / 1e9;
  const Config tight = config({"parallel.memory_limit_gb=" + std::to_string(limit_gb)});
  auto chosen = auto_plan(tight, Registries{}, cost_of(tight), 4);
  ASSERT_TRUE(chosen.ok()) << chosen.error().message;
  EXPECT_LE(chosen->plan.estimate.max_peak_bytes(), limit_gb * 1e9);
  EXPECT_TRUE(chosen->config.parallel.recompute != "none" || chosen->config.parallel.zero > 0)
      << chosen->top[0].label;
  EXPECT_GE(chosen->top[0].step_s, free->top[0].step_s);
}

TEST(AutoPlan, NothingFitsNamesTheKey) {
  const Config c = config({"parallel.memory_limit_gb=0.000001"});
  auto chosen = auto_plan(c, Registries{}, cost_of(c), 4);
  ASSERT_FALSE(chosen.ok());
  EXPECT_NE(chosen.error().message.find("parallel.memory_limit_gb"), std::string::npos)
      << chosen.error().message;
}

}  // namespace
}  // namespace loom::plan
