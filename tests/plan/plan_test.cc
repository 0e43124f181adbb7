// make_plan without LibTorch: a GPT tiny plan over dp2 x tp2 x pp2, its estimate on the cost
// model, its errors, and plan.json for the runtime (LOOM_PLAN_OUT=DIR writes DIR/plan.json and
// DIR/config.yaml; tests/exec/plan_file_run_test.cc runs them).
#include "plan/plan.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "models/model.h"

namespace loom::plan {
namespace {

constexpr const char* kYaml =
    "model: {type: gpt, preset: tiny}\n"
    "parallel: {dp: 2, tp: 2, pp: 2}\n"
    "batch: {global: 8, micro: 2}\n"
    "optimizer: {type: sgd, lr: 0.05, momentum: 0.9}\n";

Config config(const std::vector<std::string>& overrides = {}) {
  auto c = parse_config(kYaml, "plan_test.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

TEST(MakePlan, PlansLowersAndEstimatesWithoutLibTorch) {
  auto plan = make_plan(config());
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_EQ(plan->world_size(), 8);
  EXPECT_EQ(plan->file.lowered.programs.size(), 8u);
  EXPECT_EQ(plan->file.micro_batches, 2);
  EXPECT_FALSE(plan->file.hash.empty());
  EXPECT_FALSE(plan->schedule.csv.empty());  // pipelined: the schedule as torch's CSV
  EXPECT_EQ(plan->file.schedule_csv, plan->schedule.csv);
  ASSERT_EQ(plan->estimate.ranks.size(), 8u);
  double params = 0;
  for (const auto& r : plan->estimate.ranks) {
    EXPECT_GT(r.peak_bytes, r.param_bytes);
    EXPECT_GT(r.compute_s, 0);
    params += r.parameters;
  }
  // Every parameter element is held by each of the dp (2) replicas, some by more ranks (norms
  // replicated over tp, the tied embedding on the first and the last stage); no rank holds all.
  int64_t model_params = 0;
  for (const auto& t : plan->model.tensors())
    if (t.role == graph::TensorRole::kParameter) model_params += numel(t.shape);
  EXPECT_GE(params, 2.0 * static_cast<double>(model_params));
  for (const auto& r : plan->estimate.ranks)
    EXPECT_LT(r.parameters, static_cast<double>(model_params));
  // plan.json round-trips.
  auto json = lower::plan_to_json(plan->file);
  ASSERT_TRUE(json.ok());
  auto back = lower::plan_from_json(*json, "plan.json");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->hash, plan->file.hash);

  if (const char* out = std::getenv("LOOM_PLAN_OUT")) {
    std::filesystem::create_directories(out);
    std::ofstream(std::filesystem::path(out) / "plan.json") << *json;
    std::ofstream(std::filesystem::path(out) / "config.yaml") << kYaml;
  }
}

// The estimate follows the cost model: an H100 computes 4x faster than the A100 preset, and the
// cost model names itself in the plan.
TEST(MakePlan, TheEstimateFollowsTheCostModel) {
  auto a100 = make_plan(config());
  auto h100 = make_plan(config({"cost.preset=h100"}));
  ASSERT_TRUE(a100.ok() && h100.ok());
  EXPECT_NE(h100->cost.name.find("h100"), std::string::npos);
  const double a = a100->estimate.ranks[0].compute_s, h = h100->estimate.ranks[0].compute_s;
  EXPECT_NEAR(a / h, 4.0, 1e-9);  // both presets' FLOP rates, 400e12 / 100e12
  EXPECT_EQ(a100->estimate.max_peak_bytes(),
            h100->estimate.max_peak_bytes());  // memory is the model's
  // A cost-model key changes the plan's hash (it shapes the communication paths).
  EXPECT_NE(a100->file.hash, h100->file.hash);
}

TEST(MakePlan, UserMistakesNameTheKey) {
  auto plan = make_plan(config({"parallel.tp=3", "parallel.dp=1", "parallel.pp=1"}));
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().message.find("parallel.tp"), std::string::npos) << plan.error().message;
  // More micro-batches per step than message tags can tell apart.
  auto many = make_plan(config(
      {"batch.global=4100", "batch.micro=1", "parallel.dp=2", "parallel.pp=1", "parallel.tp=1"}));
  ASSERT_FALSE(many.ok());
  EXPECT_NE(many.error().message.find("batch.global"), std::string::npos) << many.error().message;
  EXPECT_NE(many.error().message.find("2050 micro-batches"), std::string::npos)
      << many.error().message;
  auto preset = make_plan(config({"cost.preset=tpu"}));
  ASSERT_FALSE(preset.ok());
  EXPECT_NE(preset.error().message.find("cost.preset"), std::string::npos)
      << preset.error().message;
}

// A user's model builder (the embedding API's) is planned like a zoo model: its model.type
// need not be one of the zoo's.
TEST(MakePlan, AUserModelIsPlannedLikeAZooModel) {
  Registries registries;
  int built = 0;
  registries.model = [&built](const Config& c, const graph::OpRegistry& ops) {
    ++built;
    Config gpt = c;
    gpt.model.type = "gpt";
    return models::build_model(gpt, ops);
  };
  auto plan = make_plan(config({"model.type=my-lm"}), registries);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_EQ(built, 1);
  EXPECT_EQ(plan->file.lowered.programs.size(), 8u);
}

}  // namespace
}  // namespace loom::plan
