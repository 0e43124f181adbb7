// The config read once into a PlanSpec: the mesh, the schedule, the memory features, the batch
// and what the run is made of, with the key named when a value cannot be read; errors found below
// plan/ located at the door; the spec written back (with_spec); the plan hash and plan_for.
#include "plan/plan_spec.h"

#include <gtest/gtest.h>

#include "plan/plan.h"
#include "plan/plan_for.h"
#include "plan/plan_hash.h"

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

// What the run is made of, read once into values.
TEST(PlanSpec, ReadsTheRunsDevicePrecisionBackendBucketsAndOptimizer) {
  auto c = parse_config(
      "model: {type: gpt, preset: tiny}\nparallel: {dp: 2}\nbatch: {global: 8, micro: 2}\n"
      "run: {precision: bf16}\ncomm: {backend: mpi, bucket_mb: 2}\n"
      "optimizer: {type: sgd, weight_decay: 0.1}\n",
      "run.yaml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto spec = PlanSpec::of(*c);
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_EQ(spec->device, Device::kCpu);
  EXPECT_EQ(spec->precision, Precision::kBf16);
  EXPECT_EQ(spec->backend, CommBackend::kMpi);
  EXPECT_TRUE(spec->comm_traits().shard_out_of_place);
  EXPECT_EQ(spec->bucket_bytes, 2 << 20);
  EXPECT_EQ(spec->optimizer, OptimizerKind::kSgd);
  EXPECT_TRUE(spec->weight_decay);
  EXPECT_EQ(spec->micro_batches(), 2);  // 8 / (2 x dp 2)
  // comm.backend auto: what a loomrun job on the run's device resolves it to.
  auto gpu = parse_config("model: {type: gpt, preset: tiny}\nrun: {device: cuda}\n", "gpu.yaml");
  ASSERT_TRUE(gpu.ok());
  EXPECT_TRUE(PlanSpec::of(*gpu)->comm_traits().defers_sends);
  EXPECT_TRUE(PlanSpec::of(config("{dp: 1}"))->comm_traits().collectives_through_all_to_all);
}

// Errors found below plan/ carry their key; make_plan adds where the key came from, once.
TEST(PlanSpec, ErrorsFromBelowAreLocatedAtTheDoor) {
  auto c = parse_config(
      "model: {type: gpt, preset: tiny}\nbatch: {global: 8, micro: 1}\nparallel:\n  pp: 2\n"
      "  schedule: csv\n  schedule_csv: /nonexistent/loom-schedule.csv\n",
      "door.yaml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto plan = make_plan(*c);  // lower::pipeline_order reads the file
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.error().message.rfind("door.yaml:6: parallel.schedule_csv: cannot read", 0), 0u)
      << plan.error().message;
  // The planner's stage check, from parallel.stages' line.
  auto stages = parse_config(
      "model: {type: gpt, preset: tiny}\nbatch: {global: 8, micro: 1}\nparallel:\n  pp: 2\n"
      "  stages: [[0, 0], [2, 1]]\n",
      "stages.yaml");
  ASSERT_TRUE(stages.ok()) << stages.error().message;
  auto refused = make_plan(*stages);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().message.rfind("stages.yaml:5: parallel.stages: entry 1", 0), 0u)
      << refused.error().message;
  // An error already located is not located twice.
  const Error once = stages->locate(refused.error());
  EXPECT_EQ(once.message, refused.error().message);
}

// with_spec writes a spec back into the config: PlanSpec::of reads the same spec from it.
TEST(PlanSpec, WithSpecIsTheInverseOfOf) {
  const Config base = config("{dp: 1}");
  auto wanted = PlanSpec::of(
      config("{dp: 2, tp: 2, pp: 2, cp: 1, sp: true, schedule: interleaved, chunks: 2, "
             "recompute: full, zero: 1, stages: [[0, 0], [1, 1], [2, 2], [3, 3]]}"));
  ASSERT_TRUE(wanted.ok()) << wanted.error().message;
  auto back = PlanSpec::of(with_spec(base, *wanted));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->plan_fields(), wanted->plan_fields());
  EXPECT_EQ(back->batch, wanted->batch);
}

// The hash covers the values that shape a plan: not the optimizer's or the run's length.
TEST(PlanHash, FollowsThePlanValuesOnly) {
  const CostModel& cost = CostModel::builtin();
  auto hash = [&](const std::string& parallel, const std::string& digest = "m") {
    return plan_hash(*PlanSpec::of(config(parallel)), cost, digest, "code");
  };
  const std::string base = hash("{tp: 2}");
  EXPECT_EQ(base.size(), 16u);
  EXPECT_EQ(base, hash("{tp: 2}"));
  EXPECT_NE(base, hash("{tp: 2, sp: true}"));
  EXPECT_NE(base, hash("{tp: 2, recompute: selective}"));
  EXPECT_NE(base, hash("{tp: 2}", "another model"));
  auto lr = parse_config(
      "model: {type: gpt, preset: tiny}\nparallel: {tp: 2}\nbatch: {global: 8, micro: 1}\n"
      "optimizer: {lr: 0.5}\nrun: {steps: 3}\n",
      "lr.yaml");
  ASSERT_TRUE(lr.ok());
  EXPECT_EQ(base, plan_hash(*PlanSpec::of(*lr), cost, "m", "code"));
  CostModel slower = cost;
  slower.device_flops_per_s /= 2;
  EXPECT_NE(base, plan_hash(*PlanSpec::of(config("{tp: 2}")), slower, "m", "code"));
}

// A plan made on another cost model is stale, and says so; the plan's recorded config is not
// used to read any cost file.
TEST(PlanHash, APlanOfAnotherCostModelIsStale) {
  const Config made_on = config("{tp: 2}");
  auto plan = make_plan(made_on);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  plan->file.source = "p/plan.json";
  Config now = made_on;
  now.cost.device_flops_per_s = 1e9;
  Status s =
      check_plan_current(plan->file, now, plan->file.model_digest, plan->file.code_fingerprint);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("made on another cost model, cost.*"), std::string::npos)
      << s.error().message;
  EXPECT_TRUE(
      check_plan_current(plan->file, made_on, plan->file.model_digest, plan->file.code_fingerprint)
          .ok());
}

// plan_for: make_plan's plan for a given split, the auto-planner's choice (and what it ranked)
// under parallel.policy auto, with the config that choice is made of.
TEST(PlanFor, GivenOrSearched) {
  const Config given = config("{dp: 2}");
  auto made = plan_for(given, Registries{}, CostModel::builtin());
  ASSERT_TRUE(made.ok()) << made.error().message;
  EXPECT_TRUE(made->search.empty());
  EXPECT_EQ(made->plan.world_size(), 2);
  EXPECT_EQ(made->plan.file.hash,
            make_plan(given, Registries{}, CostModel::builtin(), 2)->file.hash);
  AutoOptions quick;
  quick.top = 2;
  quick.expand = 1;
  auto searched = plan_for(config("{policy: auto}"), Registries{}, CostModel::builtin(), 2, quick);
  ASSERT_TRUE(searched.ok()) << searched.error().message;
  EXPECT_NE(searched->search.find("parallel.policy auto"), std::string::npos) << searched->search;
  EXPECT_EQ(searched->plan.world_size(), 2);
  EXPECT_EQ(searched->config.parallel.world_size(), 2);
  EXPECT_NE(searched->config.parallel.policy, "auto");
  // The plan is the one its config makes.
  auto again = make_plan(searched->config, Registries{}, CostModel::builtin(), 2);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->file.hash, searched->plan.file.hash);
}

}  // namespace
}  // namespace loom::plan
