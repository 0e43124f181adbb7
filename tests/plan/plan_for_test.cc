// plan::for_world: a config written for one world, started on another (an elastic restart),
// keeps every split but data parallelism and the global batch, or is refused by its numbers.
#include "plan/plan_for.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace loom::plan {
namespace {

Config config(const std::vector<std::string>& overrides = {}) {
  auto c = parse_config(
      "model: {type: gpt, preset: tiny}\nparallel: {dp: 2, tp: 2}\n"
      "batch: {global: 8, micro: 2}\noptimizer: {type: sgd, lr: 0.1}\n",
      "elastic.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

TEST(ForWorld, FewerRanksKeepTpAndTheGlobalBatch) {
  std::string note;
  auto c = for_world(config(), 2, &note);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->parallel.dp, 1);
  EXPECT_EQ(c->parallel.tp, 2);
  EXPECT_EQ(c->batch.global, 8);
  EXPECT_EQ(c->batch.micro, 2);
  EXPECT_EQ(c->micro_batches(), 4);  // twice the micro-batches on half the replicas
  EXPECT_NE(note.find("started on 2 ranks"), std::string::npos) << note;
  EXPECT_NE(note.find("parallel.dp 2 -> 1"), std::string::npos) << note;
  EXPECT_NE(note.find("2 -> 4 micro-batches per rank per step"), std::string::npos) << note;
  auto plan = make_plan(*c);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_EQ(plan->world_size(), 2);
}

TEST(ForWorld, MoreRanksAddReplicas) {
  std::string note;
  auto c = for_world(config(), 8, &note);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->parallel.dp, 4);
  EXPECT_EQ(c->micro_batches(), 1);
}

TEST(ForWorld, TheConfigsOwnWorldAndAutoAreLeftAsTheyAre) {
  std::string note = "stale";
  auto same = for_world(config(), 4, &note);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->parallel.dp, 2);
  EXPECT_TRUE(note.empty());
  auto automatic = for_world(config({"parallel.policy=auto"}), 2, &note);
  ASSERT_TRUE(automatic.ok()) << automatic.error().message;
  EXPECT_EQ(automatic->parallel.dp, 2);  // the auto-planner plans for the world itself
  EXPECT_TRUE(note.empty());
}

TEST(ForWorld, AWorldTheSplitsOrTheBatchDoNotDivideIsRefused) {
  std::string note;
  auto three = for_world(config(), 3, &note);
  ASSERT_FALSE(three.ok());
  EXPECT_EQ(three.error().key, "parallel.dp");
  EXPECT_NE(three.error().message.find("the tp x pp x cp it keeps (2) does not divide 3"),
            std::string::npos)
      << three.error().message;
  auto sixteen = for_world(config(), 16, &note);
  ASSERT_FALSE(sixteen.ok());
  EXPECT_EQ(sixteen.error().key, "batch.global");
  EXPECT_NE(sixteen.error().message.find(
                "batch.global (8) is not divisible by batch.micro (2) x parallel.dp (8)"),
            std::string::npos)
      << sixteen.error().message;
}

}  // namespace
}  // namespace loom::plan
