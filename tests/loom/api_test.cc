// The embedding API in-process: a trainer from a config file with step hooks, fit, plan and
// dump_plan; user additions that are refused name what is wrong; a Setup copy is independent.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "launch/planned_trainer.h"
#include "loom/kernel.h"
#include "loom/loom.h"
#include "models/model.h"
#include "runtime/trainer.h"
#include "tests/support/plan_chain.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

fs::path config_file() {
  const fs::path dir = fs::path(testing::TempDir()) / "loom_api_test";
  fs::create_directories(dir);
  std::ofstream(dir / "c.yaml")
      << "run: {steps: 3}\nmodel: {type: gpt, preset: tiny}\nbatch: {global: 8, micro: 4}\n";
  return dir / "c.yaml";
}

TEST(Api, FitRunsTheStepsAndCallsEveryHook) {
  auto trainer = Trainer::from_file(config_file().string());
  ASSERT_TRUE(trainer.ok()) << trainer.error().message;
  std::vector<int64_t> seen;
  std::vector<double> losses;
  (*trainer)->on_step([&](const StepStats& s) { seen.push_back(s.step); });
  (*trainer)->on_step([&](const StepStats& s) { losses.push_back(s.loss); });
  ASSERT_TRUE((*trainer)->fit().ok());
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2, 3}));
  ASSERT_EQ(losses.size(), 3u);
  EXPECT_GT(losses[0], 0);
  ASSERT_TRUE((*trainer)->fit(2).ok());  // two more
  EXPECT_EQ((*trainer)->steps_done(), 5);
  EXPECT_EQ(seen.back(), 5);
}

TEST(Api, PlanAndDumpPlanMatchTheConfig) {
  auto trainer = Trainer::from_file(config_file().string(), {"run.steps=1"});
  ASSERT_TRUE(trainer.ok()) << trainer.error().message;
  const lower::PlanFile* plan = &(*trainer)->plan();
  EXPECT_EQ(plan->world_size, 1);
  EXPECT_EQ(plan->micro_batches, 2);
  const fs::path dir = fs::path(testing::TempDir()) / "loom_api_plan";
  fs::remove_all(dir);
  ASSERT_TRUE((*trainer)->dump_plan(dir.string()).ok());
  auto back = lower::load_plan_file((dir / "plan.json").string());
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->hash, plan->hash);
  EXPECT_TRUE(fs::exists(dir / "programs" / "rank_0.txt"));
  // The whole dump `loom plan` writes: the estimate per rank too.
  EXPECT_TRUE(fs::exists(dir / "summary.txt"));
  EXPECT_TRUE(fs::exists(dir / "summary.json"));
  // A config the plan was not made for: the plan is stale.
  const Config other_config =
      *parse_config("model: {type: gpt, preset: tiny}\nbatch: {global: 8, micro: 2}\n", "x.yaml");
  auto other = make_plan(other_config);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->hash, plan->hash);
  // and running it under that config is refused, naming the key that differs.
  auto stale = launch::create_trainer(other_config, nullptr, &*back);
  ASSERT_FALSE(stale.ok());
  EXPECT_NE(stale.error().message.find("stale plan"), std::string::npos) << stale.error().message;
  EXPECT_NE(stale.error().message.find("batch.micro was 4 in the plan, is 2 now"),
            std::string::npos)
      << stale.error().message;
}

TEST(Api, RefusedAdditionsSayWhy) {
  loom::Setup setup;
  Status s = add_kernel(setup, "swish",
                        [](const KernelContext&, const std::vector<at::Tensor>& in) { return in; });
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("'swish', which is not registered"), std::string::npos)
      << s.error().message;
  EXPECT_FALSE(
      setup.add_op(graph::OpSchema::simple("linear", "m k+, k+ n -> m n")).ok());  // built in
  ASSERT_TRUE(setup.add_op(graph::OpSchema::simple("swish", "b s h -> b s h")).ok());
  loom::Setup copy = setup;
  ASSERT_TRUE(copy.add_op(graph::OpSchema::simple("mish", "b s h -> b s h")).ok());
  EXPECT_NE(copy.ops().find("mish"), nullptr);
  EXPECT_EQ(setup.ops().find("mish"), nullptr);  // copies share nothing
  // A model builder whose graph cannot be trained (no op writes its loss) is an error, not a crash.
  setup.set_model(
      [](const Config&, const GraphShape&, const graph::OpRegistry& ops) -> Result<graph::Graph> {
        graph::GraphBuilder b(ops, "empty");
        auto x = b.input("x", {}, DType::kFloat32);
        b.set_loss(x);
        return b.finish();
      });
  auto trainer = Trainer::from_file(config_file().string(), {}, setup);
  ASSERT_FALSE(trainer.ok());
  EXPECT_NE(trainer.error().message.find("no op writes the loss 'x'"), std::string::npos)
      << trainer.error().message;
}

// A model type added from code is selected by model.type like the zoo's, and planned for
// several ranks like them: its parallel check refuses what it cannot split, naming the key.
TEST(Api, AnAddedModelTypeIsFirstClass) {
  loom::Setup setup;
  auto gpt_of = [](const Config& c, const GraphShape&, const graph::OpRegistry& ops) {
    Config gpt = c;
    gpt.model.type = "gpt";
    return testing_support::single_device_graph(gpt, ops);
  };
  ASSERT_TRUE(setup
                  .add_model("my-lm", gpt_of,
                             [](const Config& c, const planner::SpaceSpec& space) -> Status {
                               if (space.mesh.tp() > 2)
                                 return c.error("parallel.tp", "my-lm splits in two at most");
                               return Status::success();
                             })
                  .ok());
  EXPECT_FALSE(setup.add_model("gpt", gpt_of).ok());  // the zoo's name
  auto trainer =
      Trainer::from_file(config_file().string(), {"model.type=my-lm", "run.steps=2"}, setup);
  ASSERT_TRUE(trainer.ok()) << trainer.error().message;
  ASSERT_TRUE((*trainer)->fit().ok());
  EXPECT_EQ((*trainer)->steps_done(), 2);
  const Config tp2 = *parse_config("model: {type: my-lm}\nparallel: {tp: 2}\n", "c.yaml");
  auto plan = make_plan(tp2, setup);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_EQ(plan->world_size, 2);
  const Config tp4 = *parse_config("model: {type: my-lm}\nparallel: {tp: 4}\n", "c.yaml");
  auto refused = make_plan(tp4, setup);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("my-lm splits in two at most"), std::string::npos)
      << refused.error().message;
  // Without the Setup, the type is unknown and the error lists the types there are.
  auto unknown = make_plan(tp2);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("unknown model type 'my-lm'"), std::string::npos)
      << unknown.error().message;
}

}  // namespace
}  // namespace loom
