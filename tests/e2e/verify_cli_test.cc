// `loom verify` on the plans the suite already proves equal to one device (tests/runtime): each
// exits 0 with every figure within the tolerance policy; a bad --steps or a bad config exits 2
// naming the argument or key; --json writes the same report.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "lower/plan_file.h"

namespace {

namespace fs = std::filesystem;

struct Outcome {
  int code;
  std::string output;
};

// Runs a shell command line and returns its exit code and output.
Outcome shell(const std::string& cmd) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  int status = pclose(pipe);
  return Outcome{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

// Every run is bounded: the ranks' collectives time out on their own (comm.timeout_s), and
// `timeout` stops a run that hangs anywhere else.
Outcome run(const std::string& args) {
  return shell("timeout 120 " + std::string(LOOM_BINARY_DIR) + "/bin/loom " + args);
}

// loomrun with `args`, its workers with one intra-op thread each.
Outcome run_launcher(const std::string& args) {
  return shell("OMP_NUM_THREADS=1 timeout 200 " + std::string(LOOM_BINARY_DIR) + "/bin/loomrun " +
               args);
}

// A file of this test's own in the temporary directory: ctest runs the tests of this file side by
// side, so a path shared between tests would be written by one while another reads it.
fs::path own_file(const std::string& name) {
  const std::string test = testing::UnitTest::GetInstance()->current_test_info()->name();
  return fs::path(testing::TempDir()) / ("loom_verify_" + test + "_" + name);
}

// A config file in the test's temporary directory.
std::string config_file(const std::string& name, const std::string& yaml) {
  const fs::path p = own_file(name + ".yaml");
  std::ofstream(p) << yaml;
  return p.string();
}

const char* kGptSgd = R"(run: {seed: 3}
model: {type: gpt, preset: tiny}
batch: {global: 8, micro: 2}
optimizer: {type: sgd, lr: 0.3, momentum: 0.9, weight_decay: 0.01, clip_grad_norm: 1.0}
comm: {timeout_s: 60}
)";

void expect_verified(const std::string& config, const std::string& overrides,
                     const std::string& mesh) {
  const fs::path json = own_file("report.json");
  fs::remove(json);
  Outcome r = run("verify " + config + " " + overrides + " --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("plan " + mesh), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("every op's output is right"), std::string::npos) << r.output;
  std::ifstream in(json);
  ASSERT_TRUE(in) << "no report at " << json;
  const nlohmann::json report = nlohmann::json::parse(in);
  EXPECT_TRUE(report["ok"].get<bool>());
  ASSERT_EQ(report["losses"].size(), 3u);
  for (const auto& l : report["losses"]) {
    EXPECT_LE(l["rel_diff"].get<double>(), l["bound"].get<double>()) << l.dump();
    EXPECT_GT(l["plan"].get<double>(), 0.0);
  }
  // Every tensor's gradient and value after every step was compared, and the oracle ran every op.
  EXPECT_GT(report["tensors"].size(), 0u);
  EXPECT_GT(report["oracle"]["ops_checked"].get<int64_t>(), 0);
  EXPECT_TRUE(report["oracle"]["mismatches"].empty());
}

TEST(VerifyCli, GptDp2) {
  expect_verified(config_file("gpt", kGptSgd), "parallel.dp=2", "dp 2 x tp 1 x pp 1");
}
TEST(VerifyCli, GptTp2) {
  expect_verified(config_file("gpt", kGptSgd), "parallel.tp=2", "dp 1 x tp 2 x pp 1");
}
TEST(VerifyCli, GptPp2) {
  expect_verified(config_file("gpt", kGptSgd), "parallel.pp=2", "dp 1 x tp 1 x pp 2");
}
TEST(VerifyCli, GptTp2Pp2) {
  expect_verified(config_file("gpt", kGptSgd), "parallel.tp=2 parallel.pp=2", "dp 1 x tp 2 x pp 2");
}
TEST(VerifyCli, GptDp2Zero1) {
  expect_verified(config_file("gpt", kGptSgd), "parallel.dp=2 parallel.zero=1",
                  "dp 2 x tp 1 x pp 1");
}
TEST(VerifyCli, GptDp2Zero3) {
  expect_verified(config_file("gpt", kGptSgd), "parallel.dp=2 parallel.zero=3",
                  "dp 2 x tp 1 x pp 1");
}
// The shipped preset trains with AdamW (warm-up, cosine schedule, clipping).
TEST(VerifyCli, GptTinyPresetTp2AdamW) {
  expect_verified(std::string(LOOM_SOURCE_DIR) + "/configs/gpt-tiny.yaml", "parallel.tp=2",
                  "dp 1 x tp 2 x pp 1");
}
TEST(VerifyCli, LlamaTp2Pp2) {
  expect_verified(config_file("llama", R"(run: {seed: 3}
model: {type: llama, preset: tiny}
batch: {global: 8, micro: 2}
optimizer: {type: sgd, lr: 0.3, momentum: 0.9, weight_decay: 0.01, clip_grad_norm: 1.0}
comm: {timeout_s: 60}
)"),
                  "parallel.tp=2 parallel.pp=2", "dp 1 x tp 2 x pp 2");
}
// Context parallelism: ring attention over 2 ranks inside tensor parallelism 2.
TEST(VerifyCli, LlamaCp2Tp2) {
  expect_verified(std::string(LOOM_SOURCE_DIR) + "/configs/llama-tiny.yaml",
                  "parallel.cp=2 parallel.tp=2", "dp 1 x cp 2 x tp 2 x pp 1");
}
// A mixture of experts: 4 experts over 2 ranks (ep 2 within dp 2), each expert's MLP split over
// tensor parallelism 2; the shipped config, AdamW.
TEST(VerifyCli, MoeTinyEp2Tp2) {
  expect_verified(std::string(LOOM_SOURCE_DIR) + "/configs/moe-tiny.yaml", "",
                  "dp 2 (ep 2) x tp 2 x pp 1");
}
// The shipped Llama preset with AdamW, kv heads repeated over 4 tensor-parallel ranks.
TEST(VerifyCli, LlamaTinyPresetTp4AdamW) {
  expect_verified(std::string(LOOM_SOURCE_DIR) + "/configs/llama-tiny.yaml", "parallel.tp=4",
                  "dp 1 x tp 4 x pp 1");
}
TEST(VerifyCli, SwinWindow2) {
  expect_verified(config_file("swin", R"(run: {seed: 5}
model: {type: swin, preset: tiny}
batch: {global: 4, micro: 2}
optimizer: {type: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.01, clip_grad_norm: 1.0}
comm: {timeout_s: 60}
)"),
                  "parallel.policy=window parallel.tp=2", "dp 1 x tp 2 x pp 1 (2 ranks; window");
}
TEST(VerifyCli, EvoformerDap2) {
  expect_verified(config_file("evo", R"(run: {seed: 3}
model: {type: evoformer, preset: tiny}
batch: {global: 4, micro: 2}
optimizer: {type: sgd, lr: 0.2, momentum: 0.9}
comm: {timeout_s: 60}
)"),
                  "parallel.policy=dap parallel.tp=2", "dp 1 x tp 2 x pp 1 (2 ranks; dap");
}

// The plan's ranks as loomrun processes over gloo: rank 0 alone prints the report and exits with
// its verdict.
TEST(VerifyCli, GptTp2OnTwoLoomrunProcesses) {
  const fs::path json = own_file("report.json");
  fs::remove(json);
  Outcome r =
      run_launcher("--nproc-per-node 2 --standalone " + std::string(LOOM_BINARY_DIR) +
                   "/bin/loom verify " + config_file("gpt", kGptSgd) +
                   " parallel.tp=2 comm.backend=gloo --ranks launched --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string header = "plan dp 1 x tp 2 x pp 1";
  const size_t first = r.output.find(header);
  ASSERT_NE(first, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(header, first + 1), std::string::npos) << "printed twice:\n" << r.output;
  std::ifstream in(json);
  ASSERT_TRUE(in) << "no report at " << json;
  const nlohmann::json report = nlohmann::json::parse(in);
  EXPECT_TRUE(report["ok"].get<bool>());
  EXPECT_EQ(report["world_size"].get<int64_t>(), 2);
  ASSERT_EQ(report["losses"].size(), 3u);
  // Both ranks' pieces are in the table: tp2 splits the first layer's query weight over them.
  std::set<int64_t> ranks;
  for (const auto& t : report["tensors"]) ranks.insert(t["rank"].get<int64_t>());
  EXPECT_EQ(ranks, (std::set<int64_t>{0, 1})) << report["tensors"].dump();
  EXPECT_GT(report["oracle"]["ops_checked"].get<int64_t>(), 0);
}

// Processes started for another plan: exit 2 naming WORLD_SIZE, before anything runs.
TEST(VerifyCli, LaunchedWorldOfTheWrongSizeExitsTwo) {
  Outcome r = run_launcher("--nproc-per-node 2 --standalone " + std::string(LOOM_BINARY_DIR) +
                           "/bin/loom verify " + config_file("gpt", kGptSgd) +
                           " parallel.tp=4 comm.backend=gloo --ranks launched");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("WORLD_SIZE"), std::string::npos) << r.output;
}

TEST(VerifyCli, BadStepsExitsTwoNamingTheArgument) {
  Outcome r = run("verify " + config_file("gpt", kGptSgd) + " parallel.tp=2 --steps 0");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--steps"), std::string::npos) << r.output;
}

TEST(VerifyCli, BadConfigExitsTwoNamingTheKey) {
  Outcome r = run("verify " + config_file("gpt", kGptSgd) + " parallel.tp=3");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("parallel.tp"), std::string::npos) << r.output;
}

// `loom verify --static`: the plan proven equal to one device without running it
// (lower/equivalence.h). A config's plan exits 0; a plan.json edited after `loom plan` wrote it
// is judged as written (saying its seal does not match) and exits 1 naming the rank and op;
// bad input exits 2.
TEST(VerifyCli, StaticProvesAConfigsPlan) {
  Outcome r = run("verify --static " + config_file("gpt", kGptSgd) +
                  " parallel.dp=2 parallel.tp=2 parallel.pp=2 parallel.zero=1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("(8 ranks) is equal to one device"), std::string::npos) << r.output;
}

// `loom plan` of GPT tiny under `degrees`, its plan.json changed in one place by `edit` (none:
// as `loom plan` wrote and sealed it), and sealed again over the edit where `reseal`.
fs::path edited_plan(const std::string& config, const std::string& degrees,
                     const std::function<void(nlohmann::ordered_json&)>& edit, bool reseal) {
  const fs::path dir = own_file("plan");
  fs::remove_all(dir);
  Outcome planned = run("plan " + config + " " + degrees + " --out " + dir.string());
  EXPECT_EQ(planned.code, 0) << planned.output;
  const fs::path file = dir / "plan.json";
  nlohmann::ordered_json plan;
  {
    std::ifstream in(file);
    plan = nlohmann::ordered_json::parse(in);
  }
  if (!edit) return file;
  edit(plan);
  if (!reseal) {
    std::ofstream(file) << plan.dump();
    return file;
  }
  plan.erase("seal");
  std::ofstream(file) << loom::lower::seal_plan_json(plan.dump());
  return file;
}

// GPT tiny tp2 x pp2's plan.json changed in one place by `edit`, judged.
Outcome verify_edited(const std::function<void(nlohmann::ordered_json&)>& edit) {
  const std::string config = config_file("gpt", kGptSgd);
  const fs::path file = edited_plan(config, "parallel.tp=2 parallel.pp=2", edit, false);
  return run("verify --static " + config + " parallel.tp=2 parallel.pp=2 --plan " + file.string());
}

// The issue's first crash: an op of rank 0 moved to rank 1.
void move_an_op_to_rank_1(nlohmann::ordered_json& plan) {
  for (auto& op : plan["graph"]["ops"])
    if (!op.contains("device")) {  // rank 0 (zero is left out)
      op["device"] = "1";
      return;
    }
  ADD_FAILURE() << "no op on rank 0";
}

TEST(VerifyCli, StaticJudgesAnUneditedPlanFile) {
  Outcome r = verify_edited(nullptr);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("seal"), std::string::npos) << r.output;
}

TEST(VerifyCli, StaticNamesAnOpMovedToAnotherRank) {
  // A segmentation fault in training before plans were proven.
  Outcome r = verify_edited(move_an_op_to_rank_1);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("seal does not match"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("NOT equal to one device"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank "), std::string::npos) << r.output;
  std::printf("%s", r.output.c_str());  // the message a user reads
}

TEST(VerifyCli, StaticNamesAnInputRangeShiftedByOne) {
  // The issue's silent one: an op's input range shifted by one element trained to exit 0.
  Outcome r = verify_edited([](nlohmann::ordered_json& plan) {
    for (auto& op : plan["graph"]["ops"])
      for (auto& in : op["inputs"])
        for (auto& range : in["ranges"])
          if (range.contains("start") && range.contains("end")) {
            range["start"] = std::to_string(std::stoll(range["start"].get<std::string>()) - 1);
            range["end"] = std::to_string(std::stoll(range["end"].get<std::string>()) - 1);
            return;
          }
  });
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("NOT equal to one device"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("op '"), std::string::npos) << r.output;
  std::printf("%s", r.output.c_str());
}

// The seal is a checksum anyone can recompute: an edited plan sealed again passes the loader, so
// `loom train --plan` proves every plan against the config's model before running it. Here the
// op moved to another rank (a segmentation fault in training before) is refused with exit 2 by
// every rank, naming the file, and no step runs.
TEST(VerifyCli, TrainRefusesAResealedEditedPlan) {
  const std::string config = config_file("gpt", kGptSgd);
  const fs::path file = edited_plan(config, "parallel.tp=2", move_an_op_to_rank_1, true);
  const fs::path out = own_file("run");
  fs::remove_all(out);
  Outcome r = run_launcher(
      "--nproc-per-node 2 --standalone " + std::string(LOOM_BINARY_DIR) + "/bin/loom train " +
      config + " parallel.tp=2 comm.backend=gloo run.steps=2 run.output_dir=" + out.string() +
      " --plan " + file.string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(file.string() + ": the plan is not equal to one device"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out / "metrics.jsonl")) << "a step ran";
}

TEST(VerifyCli, StaticBadInputExitsTwo) {
  const std::string config = config_file("gpt", kGptSgd);
  Outcome missing = run("verify --static " + config + " --plan /nonexistent/plan.json");
  EXPECT_EQ(missing.code, 2) << missing.output;
  Outcome without = run("verify " + config + " --plan plan.json");
  EXPECT_EQ(without.code, 2) << without.output;
  EXPECT_NE(without.output.find("--static"), std::string::npos) << without.output;
}

}  // namespace
