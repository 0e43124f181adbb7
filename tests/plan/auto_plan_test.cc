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

// A Llama of `seq` tokens: two samples per step, so dp stops at 2.
Config llama(int64_t seq, std::vector<std::string> overrides = {}) {
  overrides.push_back("model.args.seq=" + std::to_string(seq));
  auto c = parse_config(R"(model: {type: llama, preset: tiny, args: {layers: 2}}
batch: {global: 2, micro: 1}
optimizer: {type: adamw, lr: 0.001}
cost: {preset: cpu}
parallel: {policy: auto}
)",
                        "long.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

AutoOptions every_fit() {
  AutoOptions options;
  options.top = 1000;  // list every candidate that fits
  return options;
}

// A long sequence has context parallelism searched (cuts of at least 1024 tokens: cp 2 and 4 on
// 4 ranks); its candidates are planned whole and labelled with cp. A short one that fits without
// it does not multiply the shapes with cp.
TEST(AutoPlan, LongSequencesSearchContextParallelism) {
  const Config c = llama(8192);
  auto chosen = auto_plan(c, Registries{}, cost_of(c), 4, every_fit());
  ASSERT_TRUE(chosen.ok()) << chosen.error().message;
  EXPECT_GT(chosen->with_cp, 0);
  EXPECT_LE(chosen->plan.estimate.max_peak_bytes(), chosen->memory_limit_bytes);
  int64_t with_cp = 0;
  for (const AutoCandidate& cand : chosen->top) {
    auto config = parse_config(to_yaml(c), "long.yaml", cand.overrides);
    ASSERT_TRUE(config.ok()) << config.error().message;
    if (config->parallel.cp == 1) continue;
    ++with_cp;
    EXPECT_NE(cand.label.find("cp" + std::to_string(config->parallel.cp) + " "), std::string::npos)
        << cand.label;
    EXPECT_EQ(config->parallel.world_size(), 4) << cand.label;
    auto plan = make_plan(*config, Registries{}, cost_of(c), 4);
    ASSERT_TRUE(plan.ok()) << cand.label << ": " << plan.error().message;
    EXPECT_DOUBLE_EQ(plan->estimate.step_s, cand.step_s) << cand.label;
    EXPECT_LE(cand.peak_bytes, chosen->memory_limit_bytes) << cand.label;
  }
  EXPECT_GT(with_cp, 0);

  const Config short_seq = llama(1024);
  auto plain = auto_plan(short_seq, Registries{}, cost_of(short_seq), 4);
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_EQ(plain->with_cp, 0);
  EXPECT_EQ(plain->config.parallel.cp, 1);
}

// Below the long-sequence threshold, a limit no layout without cp reaches at its lowest rung
// (full recomputation, ZeRO 3 where there are replicas, micro-batches of one): the search cuts
// the sequence and the winner fits.
TEST(AutoPlan, ContextParallelismWhenNothingElseFits) {
  const Config base = llama(4096);
  double lowest = 0;
  for (const std::vector<std::string>& hand :
       {std::vector<std::string>{"parallel.dp=2", "parallel.tp=2", "parallel.sp=true"},
        {"parallel.dp=2", "parallel.pp=2"},
        {"parallel.tp=4", "parallel.sp=true"},
        {"parallel.tp=2", "parallel.sp=true", "parallel.pp=2"}}) {
    std::vector<std::string> overrides = {"parallel.policy=hybrid", "parallel.recompute=full"};
    overrides.insert(overrides.end(), hand.begin(), hand.end());
    if (hand[0] == "parallel.dp=2") overrides.push_back("parallel.zero=3");
    const Config c = llama(4096, overrides);
    auto plan = make_plan(c, Registries{}, cost_of(c), 4);
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    const double peak = plan->estimate.max_peak_bytes();
    lowest = lowest == 0 ? peak : std::min(lowest, peak);
  }
  const double limit_gb = 0.9 * lowest / 1e9;
  const Config tight = llama(4096, {"parallel.memory_limit_gb=" + std::to_string(limit_gb)});
  auto chosen = auto_plan(tight, Registries{}, cost_of(base), 4);
  ASSERT_TRUE(chosen.ok()) << chosen.error().message;
  EXPECT_GT(chosen->with_cp, 0);
  EXPECT_GT(chosen->config.parallel.cp, 1) << chosen->top[0].label;
  EXPECT_LE(chosen->plan.estimate.max_peak_bytes(), limit_gb * 1e9);
}

// tiny-moe: 4 experts. Expert parallelism is carved out of dp (the world stays 4 ranks); every
// candidate with ep > 1 is a valid plan of its own config. On data-parallel proxies (a world past
// exact_ranks) ep shapes are planned on a proxy of one ep group and ranked on their whole plans.
TEST(AutoPlan, MixturesSearchExpertParallelism) {
  for (const int64_t world : {4, 8}) {
    SCOPED_TRACE("world " + std::to_string(world));
    const Config c = config({"model.type=llama", "model.preset=tiny-moe", "model.args.layers=2"});
    AutoOptions options = every_fit();
    options.exact_ranks = 4;  // world 8: proxies
    auto chosen = auto_plan(c, Registries{}, cost_of(c), world, options);
    ASSERT_TRUE(chosen.ok()) << chosen.error().message;
    EXPECT_GT(chosen->with_ep, 0);
    EXPECT_EQ(chosen->with_cp, 0);  // 32 tokens
    int64_t with_ep = 0;
    for (const AutoCandidate& cand : chosen->top) {
      EXPECT_TRUE(cand.whole) << cand.label;
      auto config = parse_config(to_yaml(c), "moe.yaml", cand.overrides);
      ASSERT_TRUE(config.ok()) << config.error().message;
      if (config->parallel.ep == 1) continue;
      ++with_ep;
      EXPECT_NE(cand.label.find("ep" + std::to_string(config->parallel.ep) + " "),
                std::string::npos)
          << cand.label;
      EXPECT_EQ(config->parallel.dp % config->parallel.ep, 0) << cand.label;
      EXPECT_EQ(config->parallel.world_size(), world) << cand.label;
      auto plan = make_plan(*config, Registries{}, cost_of(c), world);
      ASSERT_TRUE(plan.ok()) << cand.label << ": " << plan.error().message;
      EXPECT_LE(plan->estimate.max_peak_bytes(), chosen->memory_limit_bytes) << cand.label;
    }
    EXPECT_GT(with_ep, 0);
  }
}

// A dense model has no experts to split: no ep shapes.
TEST(AutoPlan, DenseModelsHaveNoExpertParallelism) {
  const Config c = config();
  auto chosen = auto_plan(c, Registries{}, cost_of(c), 4);
  ASSERT_TRUE(chosen.ok()) << chosen.error().message;
  EXPECT_EQ(chosen->with_ep, 0);
  EXPECT_EQ(chosen->with_cp, 0);
}

}  // namespace
}  // namespace loom::plan
