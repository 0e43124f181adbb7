// `loom calibrate` as a user runs it: two loomrun ranks over gloo measure this machine in a
// bounded time and write a cost model that CostModel::load and `loom plan --cost-model` accept,
// with values a CPU can have; bad arguments exit 2 naming the argument.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/cost_model.h"
#include "launch/spawn.h"

namespace {

namespace fs = std::filesystem;
using loom::launch::Launch;
using loom::launch::ProcessResult;
using loom::launch::run_processes;

ProcessResult loom_cmd(const std::vector<std::string>& args, double deadline_s) {
  Launch l;
  l.argv = {std::string(LOOM_BINARY_DIR) + "/bin/loom"};
  l.argv.insert(l.argv.end(), args.begin(), args.end());
  return run_processes({l}, deadline_s).at(0);
}

fs::path temp_dir(const std::string& name) {
  const fs::path dir = fs::path(testing::TempDir()) / ("loom_calibrate_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(Calibrate, QuickRunWritesACostModelThatPlansAccept) {
  const fs::path dir = temp_dir("quick");
  const std::string out = (dir / "calibrated.yaml").string();
  const ProcessResult r = loom_cmd({"calibrate", "--quick", "--ranks", "2", "--out", out}, 90);
  ASSERT_TRUE(r.ok()) << r.describe();
  EXPECT_LT(r.elapsed_s, 60) << r.describe();
  EXPECT_NE(r.output.find("intra_alpha_s"), std::string::npos) << r.output;  // the table

  auto m = loom::CostModel::load(out);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_GT(m->device_flops_per_s, 1e8);
  EXPECT_LT(m->device_flops_per_s, 1e13);
  EXPECT_GT(m->device_memory_bytes, 1e8);
  EXPECT_LT(m->device_memory_bytes, 1e13);
  EXPECT_GT(m->intra_alpha_s, 1e-7);
  EXPECT_LT(m->intra_alpha_s, 1e-2);
  EXPECT_GT(m->intra_beta_s_per_byte, 1e-12);  // slower than 1 TB/s over loopback
  EXPECT_LT(m->intra_beta_s_per_byte, 1e-7);   // faster than 10 MB/s
  EXPECT_GT(m->local_beta_s_per_byte, 1e-12);
  EXPECT_LT(m->local_beta_s_per_byte, 1e-8);
  EXPECT_GT(m->inter_alpha_s, 0);
  EXPECT_GT(m->inter_beta_s_per_byte, 0);
  EXPECT_EQ(m->devices_per_node, 2);

  const ProcessResult plan =
      loom_cmd({"plan", std::string(LOOM_SOURCE_DIR) + "/configs/gpt-tiny.yaml", "parallel.dp=2",
                "--out", (dir / "plan").string(), "--cost-model", out},
               60);
  ASSERT_TRUE(plan.ok()) << plan.describe();
  EXPECT_NE(plan.output.find(out), std::string::npos)
      << plan.output;  // "cost model: custom from F"
}

TEST(Calibrate, TimesAConfigsLinears) {
  const fs::path dir = temp_dir("config");
  const std::string out = (dir / "gpt.yaml").string();
  const ProcessResult r =
      loom_cmd({"calibrate", std::string(LOOM_SOURCE_DIR) + "/configs/gpt-tiny.yaml",
                "batch.micro=2", "--quick", "--out", out},
               90);
  ASSERT_TRUE(r.ok()) << r.describe();
  auto m = loom::CostModel::load(out);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_GT(m->device_flops_per_s, 1e8);
  EXPECT_LT(m->device_flops_per_s, 1e13);
}

TEST(Calibrate, BadArgumentsExitTwoNamingThem) {
  const fs::path dir = temp_dir("bad");
  const std::string out = (dir / "x.yaml").string();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"calibrate", "--ranks", "1", "--out", out}, "--ranks"},
      {{"calibrate", "--ranks", "many", "--out", out}, "--ranks"},
      {{"calibrate", "--backend", "carrier-pigeon", "--out", out}, "--backend"},
      {{"calibrate", "--out", (dir / "missing" / "x.yaml").string()}, "--out"},
      {{"calibrate", "--out", dir.string()}, "--out"},
      {{"calibrate", "--timeout", "-1", "--out", out}, "--timeout"},
      {{"calibrate", (dir / "no-such.yaml").string(), "--out", out}, "no-such.yaml"},
      {{"calibrate", "--no-such-flag"}, "--no-such-flag"},
  };
  for (const auto& [args, expect] : cases) {
    const ProcessResult r = loom_cmd(args, 30);
    EXPECT_EQ(r.exit_code, 2) << r.describe();
    EXPECT_NE(r.output.find(expect), std::string::npos) << "missing '" << expect << "' in\n"
                                                        << r.output;
    EXPECT_FALSE(fs::exists(out));
  }
}

}  // namespace
