// parallel.* read once into the SpaceSpec the policies receive, and the policies reading it
// rather than the config.
#include "planner/space_spec.h"

#include <gtest/gtest.h>

#include "models/model.h"
#include "plan/plan_spec.h"
#include "planner/chimera.h"
#include "planner/policy.h"
#include "tests/support/plan_chain.h"

namespace loom::planner {
namespace {

Config config(const std::vector<std::string>& overrides) {
  auto c = parse_config("model: {type: gpt, preset: tiny}\nbatch: {global: 8, micro: 2}\n",
                        "s.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

TEST(SpaceSpec, ReadsTheMeshAndTheSplits) {
  auto space = testing_support::space_of(config(
      {"parallel.dp=2", "parallel.tp=2", "parallel.pp=2", "parallel.cp=2",
       "parallel.cp_kind=p2p-contiguous", "parallel.sp=true", "parallel.stages=[[0,0],[1,1]]"}));
  ASSERT_TRUE(space.ok()) << space.error().message;
  EXPECT_EQ(space->mesh.to_string(), "dp2 x pp2 x cp2 x tp2 (16 ranks)");
  EXPECT_TRUE(space->sp);
  EXPECT_EQ(space->cp_kind, CpKind::kRingContiguous);
  EXPECT_TRUE(space->ring_attention());
  EXPECT_FALSE(space->all_to_all_attention());
  ASSERT_EQ(space->stages.size(), 2u);
  EXPECT_EQ(space->stages[1].first_layer, 1);
  EXPECT_EQ(space->stages[1].last_layer, 1);
  EXPECT_EQ(space->pipeline_stages(), 2);
  EXPECT_FALSE(space->two_pipelines);  // the plan's schedule decides (plan::PlanSpec)
  EXPECT_EQ(space->policy, "hybrid");
}

TEST(SpaceSpec, ContextParallelKinds) {
  const std::pair<const char*, CpKind> kinds[] = {{"p2p", CpKind::kRing},
                                                  {"ring", CpKind::kRing},
                                                  {"p2p-contiguous", CpKind::kRingContiguous},
                                                  {"all-to-all", CpKind::kAllToAll}};
  for (const auto& [name, kind] : kinds) {
    auto space = testing_support::space_of(
        config({"parallel.cp=2", std::string("parallel.cp_kind=") + name}));
    ASSERT_TRUE(space.ok()) << name;
    EXPECT_EQ(space->cp_kind, kind) << name;
    EXPECT_EQ(space->all_to_all_attention(), kind == CpKind::kAllToAll) << name;
  }
  // Without cp > 1 no attention is rewritten, whatever the kind.
  auto one = testing_support::space_of(config({"parallel.cp_kind=all-to-all"}));
  ASSERT_TRUE(one.ok());
  EXPECT_FALSE(one->ring_attention());
  EXPECT_FALSE(one->all_to_all_attention());
}

TEST(SpaceSpec, ChimeraSetsTwoPipelinesAndIsCheckedOnce) {
  auto spec = plan::PlanSpec::of(config({"parallel.pp=2", "parallel.schedule=chimera"}));
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_TRUE(spec->space.two_pipelines);
  EXPECT_FALSE(plan::PlanSpec::of(config({"parallel.pp=2"}))->space.two_pipelines);
  auto odd = plan::PlanSpec::of(config({"parallel.pp=3", "parallel.schedule=chimera"}));
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.error().message.find("parallel.pp"), std::string::npos) << odd.error().message;
  EXPECT_NE(odd.error().message.find("even number"), std::string::npos) << odd.error().message;
  auto chunks = plan::PlanSpec::of(
      config({"parallel.pp=2", "parallel.chunks=2", "parallel.schedule=chimera"}));
  ASSERT_FALSE(chunks.ok());
  EXPECT_NE(chunks.error().message.find("parallel.chunks"), std::string::npos);
  auto cp =
      plan::PlanSpec::of(config({"parallel.pp=2", "parallel.cp=2", "parallel.schedule=chimera"}));
  ASSERT_FALSE(cp.ok());
  EXPECT_NE(cp.error().message.find("parallel.cp"), std::string::npos);
}

// The hybrid policy places the second pipeline because the space says so: the same config with
// and without two_pipelines gives one and two pipelines.
TEST(SpaceSpec, ThePolicyReadsTheSpaceNotTheSchedulesName) {
  const Config c = config({"parallel.pp=2"});
  auto single = testing_support::single_device_graph(c);
  ASSERT_TRUE(single.ok()) << single.error().message;
  auto space = testing_support::space_of(c);
  ASSERT_TRUE(space.ok());
  const PolicyRegistry policies = PolicyRegistry::with_builtin_policies();
  auto one = plan_graph(*single, {*space, 2}, policies);
  ASSERT_TRUE(one.ok()) << one.error().message;
  space->two_pipelines = true;
  auto two = plan_graph(*single, {*space, 2}, policies);
  ASSERT_TRUE(two.ok()) << two.error().message;
  EXPECT_EQ(two->ops().size(), 2 * one->ops().size());
  int64_t up = 0;
  for (const auto& op : two->ops())
    if (op.name().find(kUpPipelineSuffix) != std::string::npos) ++up;
  EXPECT_EQ(up, static_cast<int64_t>(one->ops().size()));
  // The mesh, not parallel.dp: a space of two data-parallel ranks plans two ranks' worth.
  auto dp2 = testing_support::space_of(config({"parallel.dp=2"}));
  ASSERT_TRUE(dp2.ok());
  auto wrong = plan_graph(*single, {*dp2, 2}, policies);
  ASSERT_TRUE(wrong.ok()) << wrong.error().message;
  for (const auto& op : wrong->ops()) EXPECT_EQ(op.stage.value(), 0) << op.name();
}

}  // namespace
}  // namespace loom::planner
