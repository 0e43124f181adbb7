// `loom plan` at paper size: Swin C 768 (swin-6.6b, 640 px, window 40) on 32 virtual ranks under
// window parallelism 8 x pipeline 4 completes and reports memory per rank.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

namespace {

namespace fs = std::filesystem;

struct Outcome {
  int code;
  std::string output;
};

Outcome run(const std::string& args) {
  std::string cmd = std::string(LOOM_BINARY_DIR) + "/bin/loom " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  int status = pclose(pipe);
  return Outcome{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

// GiB in "12.3 GiB" (or MiB) as GiB.
double gib(const std::string& number, const std::string& unit) {
  const double v = std::stod(number);
  return unit == "GiB"   ? v
         : unit == "MiB" ? v / 1024
         : unit == "TiB" ? v * 1024
                         : v / (1024.0 * 1024 * 1024);
}

// The rows of a plan dump's summary.txt: one per rank, its peak memory the sum of its parts, an
// 80 GB device holding it. Returns the parameters summed over ranks (millions).
double expect_rank_rows(const fs::path& dir, int ranks) {
  std::ifstream summary(dir / "summary.txt");
  std::stringstream text;
  text << summary.rdbuf();
  const std::regex row(
      R"(^\s*(\d+)\s+([\d.]+)M\s+([\d.]+) (\w+) = ([\d.]+) (\w+) \+ ([\d.]+) (\w+) \+ ([\d.]+) (\w+) \+ ([\d.]+) (\w+)\s+([\d.]+) s)");
  std::string line;
  int rows = 0;
  double params = 0;
  while (std::getline(text, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, row)) continue;
    EXPECT_EQ(std::stoi(m[1]), rows) << line;
    const double peak = gib(m[3], m[4]);
    const double parts = gib(m[5], m[6]) + gib(m[7], m[8]) + gib(m[9], m[10]) + gib(m[11], m[12]);
    EXPECT_NEAR(peak, parts, 0.2) << line;
    EXPECT_GT(gib(m[11], m[12]), 0.0) << "no activations: " << line;
    EXPECT_LT(peak, 75.0) << line;
    EXPECT_GT(std::stod(m[13]), 0.0) << "no step estimate: " << line;
    params += std::stod(m[2]);
    ++rows;
  }
  EXPECT_EQ(rows, ranks) << text.str();
  return params;
}

TEST(ModelPlan, SwinC768On32RanksReportsMemoryPerRank) {
  const fs::path dir = fs::path(testing::TempDir()) / "loom_swin_c768_plan";
  fs::remove_all(dir);
  const std::string config = std::string(LOOM_SOURCE_DIR) + "/configs/swin-6.6b.yaml";
  Outcome r = run("plan " + config + " --out " + dir.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("plan: swin swin-6.6b on 32 ranks (dp 1 x tp 8 x pp 4)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("est. step time"), std::string::npos) << r.output;
  const double params = expect_rank_rows(dir, 32);
  // 32 ranks hold more than the model (window parallelism replicates early-stage weights) but
  // far less than 8 full replicas per pipeline stage.
  EXPECT_GT(params, 5866.0);
  EXPECT_LT(params, 8 * 5867.0);
}

// Llama at paper size from the shipped configs: every rank's memory and step estimated, and the
// ranks together hold each replica's parameters once (Meta's model cards: 70.55 B, 405.85 B).
TEST(ModelPlan, Llama3_70bOn64Ranks) {
  const fs::path dir = fs::path(testing::TempDir()) / "loom_llama3_70b_plan";
  fs::remove_all(dir);
  Outcome r = run("plan " + std::string(LOOM_SOURCE_DIR) + "/configs/llama3-70b.yaml --out " +
                  dir.string() + " --no-plan-json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("plan: llama llama3-70b on 64 ranks (dp 1 x tp 8 x pp 8)"),
            std::string::npos)
      << r.output;
  // Norm weights are replicated over the 8 tensor-parallel ranks: 161 x 8192 x 7 more.
  EXPECT_NEAR(expect_rank_rows(dir, 64), 70553.7 + 161 * 8192 * 7 / 1e6, 1.0);
}

TEST(ModelPlan, Llama31_405bOn1024Ranks) {
  const fs::path dir = fs::path(testing::TempDir()) / "loom_llama31_405b_plan";
  fs::remove_all(dir);
  Outcome r = run("plan " + std::string(LOOM_SOURCE_DIR) + "/configs/llama3.1-405b.yaml --out " +
                  dir.string() + " --no-plan-json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("plan: llama llama3.1-405b on 1024 ranks (dp 8 x tp 8 x pp 16)"),
            std::string::npos)
      << r.output;
  EXPECT_NEAR(expect_rank_rows(dir, 1024), 8 * (405853.4 + 253 * 16384 * 7 / 1e6), 8.0);
}

// Long context: Llama 3.1 8B at 131072 tokens on 8 ranks (cp 8, zero 3, full recomputation) and
// Llama 3 70B at 131072 tokens on 64 (cp 8 x tp 8) fit an 80 GB device, and the ring's transfers
// are counted.
TEST(ModelPlan, Llama8bAt128kTokensOn8RanksWithContextParallelism) {
  const fs::path dir = fs::path(testing::TempDir()) / "loom_llama_128k_plan";
  fs::remove_all(dir);
  Outcome r = run("plan " + std::string(LOOM_SOURCE_DIR) + "/configs/llama3-8b-128k.yaml --out " +
                  dir.string() + " --no-plan-json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("on 8 ranks (dp 1 x cp 8 p2p x tp 1 x pp 1)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("send_recv"), std::string::npos) << r.output;
  // zero 3 over the 8 context-parallel ranks: each holds an eighth of the 8.03 B parameters.
  EXPECT_NEAR(expect_rank_rows(dir, 8), 8030.3, 1.0);
}

TEST(ModelPlan, Llama70bAt128kTokensOn64Ranks) {
  const fs::path dir = fs::path(testing::TempDir()) / "loom_llama70b_128k_plan";
  fs::remove_all(dir);
  Outcome r = run("plan " + std::string(LOOM_SOURCE_DIR) +
                  "/configs/llama3-70b.yaml model.args.seq=131072 parallel.cp=8 parallel.pp=1 "
                  "parallel.zero=3 batch.global=8 --out " +
                  dir.string() + " --no-plan-json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("on 64 ranks (dp 1 x cp 8 p2p x tp 8 x pp 1)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("send_recv"), std::string::npos) << r.output;
  expect_rank_rows(dir, 64);
}

// A bad Swin argument ends in exit code 2 with one message naming the key, and nothing written.
TEST(ModelPlan, BadSwinArgumentNamesTheKey) {
  const fs::path dir = fs::path(testing::TempDir()) / "loom_swin_bad_plan";
  fs::remove_all(dir);
  const std::string config = std::string(LOOM_SOURCE_DIR) + "/configs/swin-tiny.yaml";
  for (const std::string bad :
       {"model.args.window=5", "model.args.depths=2,x", "model.args.heads=2"}) {
    Outcome r = run("plan " + config + " " + bad + " --out " + dir.string());
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(bad.substr(0, bad.find('='))), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir)) << "plan written for " << bad;
  }
}

// `loom plan` and bench/model_plans estimate a plan with the same function (plan/plan.h) on the
// same built-in cost model: for every row of the bench's quick run, `loom plan` of the same
// config prints the same step time and peak memory, to the bit (one computation, not two
// that agree within a tolerance).
TEST(ModelPlan, LoomPlanAndTheBenchPrintTheSameFigures) {
  const fs::path dir = fs::path(testing::TempDir()) / "loom_plan_vs_bench";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string bench = std::string(LOOM_BINARY_DIR) + "/bin/bench_model_plans";
  ASSERT_TRUE(fs::exists(bench)) << bench << " is not built";
  const std::string cmd =
      bench + " --quick --json " + (dir / "bench.json").string() + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(dir / "bench.json");
  const nlohmann::json rows = nlohmann::json::parse(in);
  ASSERT_GE(rows.size(), 4u);
  int compared = 0;
  for (const auto& row : rows) {
    const fs::path config = dir / ("config_" + std::to_string(compared) + ".yaml");
    std::ofstream(config) << row["yaml"].get<std::string>();
    std::string args = "plan " + config.string();
    for (const auto& o : row["overrides"]) args += " " + o.get<std::string>();
    const fs::path out = dir / ("plan_" + std::to_string(compared));
    Outcome r = run(args + " --no-plan-json --out " + out.string());
    ASSERT_EQ(r.code, 0) << args << "\n" << r.output;
    std::ifstream summary_in(out / "summary.json");
    const nlohmann::json summary = nlohmann::json::parse(summary_in);
    double peak = 0;
    for (const auto& rank : summary["ranks"])
      peak = std::max(peak, rank["peak_bytes"].get<double>());
    EXPECT_EQ(summary["step_s"].get<double>(), row["step_s"].get<double>())
        << row["case"] << " " << row["plan"];
    EXPECT_EQ(peak, row["max_peak_bytes"].get<double>()) << row["case"] << " " << row["plan"];
    EXPECT_GT(peak, 0) << row["plan"];
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(rows.size()));
}

}  // namespace

namespace {

// Mixtures of experts at scale: Mixtral 8x7B on 64 ranks (ep 8 within dp 8, tp 2, pp 4) and
// DeepSeek-V3's experts on 1024 (ep 64, pp 16) fit an 80 GB device, and the dump shows the
// experts and the all-to-all bytes that move tokens to them.
TEST(ModelPlan, Mixtral8x7bOn64RanksWithExpertParallelism) {
  const fs::path dir = fs::path(testing::TempDir()) / "loom_mixtral_plan";
  fs::remove_all(dir);
  Outcome r = run("plan " + std::string(LOOM_SOURCE_DIR) + "/configs/mixtral-8x7b.yaml --out " +
                  dir.string() + " --no-plan-json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("on 64 ranks (dp 8 (ep 8 within) x tp 2 x pp 4)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("experts: 32 layers of 8 routed experts, top 2"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("all_to_all"), std::string::npos) << r.output;
  expect_rank_rows(dir, 64);
}

TEST(ModelPlan, DeepseekV3ExpertsOn1024Ranks) {
  const fs::path dir = fs::path(testing::TempDir()) / "loom_deepseek_plan";
  fs::remove_all(dir);
  Outcome r = run("plan " + std::string(LOOM_SOURCE_DIR) + "/configs/deepseek-v3.yaml --out " +
                  dir.string() + " --no-plan-json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("experts: 58 layers of 256 routed experts, top 8"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("4 experts per rank"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("all_to_all"), std::string::npos) << r.output;
  expect_rank_rows(dir, 1024);
}

}  // namespace
