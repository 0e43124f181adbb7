#include "planner/policy.h"

#include <gtest/gtest.h>

#include "graph/verify.h"
#include "models/model.h"
#include "plan/plan.h"
#include "planner/stages.h"
#include "tests/support/plan_chain.h"

namespace loom::planner {
namespace {

Config config(const std::vector<std::string>& overrides) {
  auto c = parse_config("model: {type: gpt, preset: tiny}\nbatch: {global: 8, micro: 2}\n",
                        "p.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

Result<graph::Graph> plan(const Config& c, int64_t world) {
  return loom::plan::planned_graph(c, loom::plan::Registries{}, world);
}

std::string plan_error(const std::vector<std::string>& overrides, int64_t world) {
  auto g = plan(config(overrides), world);
  EXPECT_FALSE(g.ok());
  return g.ok() ? "" : g.error().message;
}

TEST(Policy, SubOpsPerDevice) {
  auto g = plan(config({"parallel.dp=2", "parallel.tp=2", "parallel.pp=2"}), 8);
  ASSERT_TRUE(g.ok()) << g.error().message;
  auto single = testing_support::single_device_graph(config({"parallel.dp=2"}));
  // Every single-device op becomes dp x tp sub-ops on one pipeline stage.
  EXPECT_EQ(g->ops().size(), single->ops().size() * 4);
  for (const auto& op : g->ops()) {
    int64_t pp_rank = op.device.value() / 4;
    EXPECT_EQ(pp_rank, op.stage.value()) << op.name();
  }
}

TEST(Policy, WorldSizeMustMatch) {
  EXPECT_NE(
      plan_error({"parallel.dp=2", "parallel.tp=2"}, 8)
          .find("parallel.dp (2) x parallel.tp (2) x parallel.pp (1) = 4, but the world size is 8"),
      std::string::npos);
}

TEST(Policy, TensorParallelMustDivideTheModel) {
  std::string e = plan_error({"parallel.tp=3"}, 3);
  EXPECT_NE(e.find("tensor parallelism 3 needs model.preset (tiny) heads (4) to be divisible by 3"),
            std::string::npos)
      << e;
  e = plan_error({"parallel.tp=8", "model.args.heads=8", "model.args.ffn_hidden=100"}, 8);
  EXPECT_NE(e.find("model.args.ffn_hidden (100)"), std::string::npos) << e;
  e = plan_error({"parallel.tp=2", "model.args.vocab=250", "model.args.vocab_groups=5"}, 2);
  EXPECT_NE(e.find("model.args.vocab_groups (5)"), std::string::npos) << e;
}

TEST(Policy, MoreStagesThanLayers) {
  std::string e = plan_error({"parallel.pp=4"}, 4);
  EXPECT_NE(e.find("= 4 stages, but the model has 2 layers"), std::string::npos) << e;
  e = plan_error({"parallel.pp=2", "parallel.chunks=2"}, 2);
  EXPECT_NE(e.find("parallel.chunks (2) = 4 stages"), std::string::npos) << e;
}

TEST(Policy, StageListErrors) {
  auto err = [&](const std::string& stages) {
    return plan_error({"parallel.pp=2", "model.args.layers=6", "parallel.stages=" + stages}, 2);
  };
  EXPECT_NE(err("[[0,2],[4,5]]").find("entry 1 [4, 5] skips layer 3"), std::string::npos);
  EXPECT_NE(err("[[0,3],[3,5]]").find("entry 1 [3, 5] repeats layer 3"), std::string::npos);
  EXPECT_NE(err("[[0,2],[3,4]]").find("layers 5..5 are in no stage"), std::string::npos);
  EXPECT_NE(err("[[0,5]]").find("lists 1 stages"), std::string::npos);
  EXPECT_NE(err("[[0,2],[3,9]]").find("goes past the last layer (5)"), std::string::npos);
  EXPECT_NE(err("[[1,2],[3,5]]").find("skips layer 0"), std::string::npos);
}

TEST(Policy, UnknownPolicyAndRestrictedPolicies) {
  EXPECT_NE(plan_error({"parallel.policy=hybird"}, 1).find("did you mean 'hybrid'"),
            std::string::npos);
  EXPECT_NE(plan_error({"parallel.policy=dp", "parallel.tp=2"}, 2)
                .find("policy 'dp' does not use parallel.tp (2)"),
            std::string::npos);
  EXPECT_NE(plan_error({"parallel.policy=sp", "parallel.tp=2"}, 2).find("needs parallel.sp: true"),
            std::string::npos);
}

TEST(Policy, UserPoliciesRegisterByName) {
  PolicyRegistry policies = PolicyRegistry::with_builtin_policies();
  bool called = false;
  ASSERT_TRUE(policies
                  .add("everything-on-rank-0",
                       [&](const graph::Graph& g, const PlanRequest&) -> Result<graph::Graph> {
                         called = true;
                         return g;
                       })
                  .ok());
  EXPECT_FALSE(policies.add("hybrid", hybrid_policy).ok());
  Config c = config({"parallel.policy=everything-on-rank-0"});
  loom::plan::Registries registries;
  registries.policies = policies;
  auto g = loom::plan::planned_graph(c, registries, 1);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(called);
}

TEST(Stages, BalancedByFlopsAndExplicit) {
  auto g = testing_support::single_device_graph(config({"model.args.layers=6"}));
  ASSERT_TRUE(g.ok());
  auto stages = [&g](const Config& c) {
    auto space = testing_support::space_of(c);
    EXPECT_TRUE(space.ok()) << space.error().message;
    return plan_stages(*g, *space);
  };
  auto even = stages(config({"parallel.pp=3", "model.args.layers=6"}));
  ASSERT_TRUE(even.ok()) << even.error().message;
  // The LM head and loss (vocabulary 256 x hidden 64) weigh on the last stage: it gets fewer
  // layers than the first.
  EXPECT_EQ(even->first_layer.front(), 0);
  EXPECT_EQ(even->last_layer.back(), 5);
  EXPECT_GE(even->last_layer[0] - even->first_layer[0], even->last_layer[2] - even->first_layer[2]);
  double worst = *std::max_element(even->flops.begin(), even->flops.end());
  double total = even->flops[0] + even->flops[1] + even->flops[2];
  EXPECT_LT(worst, total / 3 * 1.5);
  auto given =
      stages(config({"parallel.pp=2", "model.args.layers=6", "parallel.stages=[[0,0],[1,5]]"}));
  ASSERT_TRUE(given.ok());
  EXPECT_EQ(given->stage_of_layer(0), 0);
  EXPECT_EQ(given->stage_of_layer(1), 1);
  EXPECT_EQ(given->stage_of_layer(graph::kPreLayers), 0);
  EXPECT_EQ(given->stage_of_layer(graph::kPostLayers), 1);
}

}  // namespace
}  // namespace loom::planner
