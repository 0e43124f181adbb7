// parallel.* read once into a PlanSpec: the mesh, the schedule and the memory features, with
// the key named when a value cannot be read.
#include "plan/plan_spec.h"

#include <gtest/gtest.h>

namespace loom::plan {
namespace {

Config config(const std::string& parallel) {
  auto c = parse_config("model: {type: gpt, preset: tiny}\nparallel: " + parallel +
                            "\nbatch: {global: 8, micro: 1}\n",
                        "spec.yaml");
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

TEST(PlanSpec, ReadsTheMeshScheduleAndMemoryFeatures) {
  auto spec = PlanSpec::of(
      config("{dp: 2, tp: 2, pp: 2, schedule: zb-h1, recompute: selective, zero: 1, chunks: 1}"));
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_EQ(spec->mesh().size(), 8);
  EXPECT_TRUE(spec->schedule.is(sched::ScheduleKind::kZbH1));
  EXPECT_EQ(spec->recompute, lower::Recompute::kSelective);
  EXPECT_EQ(spec->zero, 1);
  EXPECT_TRUE(spec->pipelined());
  // Ranks are laid out tp fastest, then dp, then pp (planner/mesh.h): ranks 0..3 run pipeline
  // device 0, ranks 4..7 device 1.
  for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(spec->pipeline_device(Rank(r)), r / 4) << r;
}

TEST(PlanSpec, ASearchedScheduleSaysWhetherTheBackwardIsSplit) {
  auto spec = PlanSpec::of(config("{pp: 2, schedule: search-zb}"));
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  ASSERT_NE(spec->schedule.as_searched(), nullptr);
  EXPECT_TRUE(spec->schedule.as_searched()->split_backward);
}

TEST(PlanSpec, OneDeviceIsNotPipelined) {
  auto spec = PlanSpec::of(config("{dp: 1}"));
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_FALSE(spec->pipelined());
  EXPECT_EQ(spec->mesh().size(), 1);
}

}  // namespace
}  // namespace loom::plan
