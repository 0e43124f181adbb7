// A plan made by the planning library alone (tests/plan's test_plan, which links no LibTorch)
// runs through the executor: its plan.json, on 8 ranks as threads, trains GPT tiny equal to one
// device under the policy of tests/support/tolerance.h.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>

#include "tests/runtime/local_ranks.h"

namespace loom {
namespace {

TEST(PlanFromThePlanningLibrary, RunsEqualToOneDevice) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(testing::TempDir()) / "loom_plan_from_library";
  fs::remove_all(dir);
  const std::string make =
      "LOOM_PLAN_OUT=" + dir.string() + " " + LOOM_BINARY_DIR +
      "/bin/test_plan --gtest_filter=MakePlan.PlansLowersAndEstimatesWithoutLibTorch"
      " > /dev/null 2>&1";
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  auto plan = lower::load_plan_file((dir / "plan.json").string());
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  auto config = load_config((dir / "config.yaml").string(), {"run.steps=6", "comm.timeout_s=60"});
  ASSERT_TRUE(config.ok()) << config.error().message;
  auto one_device = load_config((dir / "config.yaml").string(),
                                {"run.steps=6", "parallel.dp=1", "parallel.tp=1", "parallel.pp=1"});
  ASSERT_TRUE(one_device.ok()) << one_device.error().message;
  const testing_support::Reference ref = testing_support::train_single_device(*one_device, 6);
  // The key bias's gradient is rounding noise by construction (distributed_test.cc).
  testing_support::expect_equal_to_single_device(ref, *config, 8, {"attn.k.b"}, &*plan);
}

}  // namespace
}  // namespace loom
