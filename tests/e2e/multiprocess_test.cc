// Multi-rank training in separate processes equals one device: gloo over TCP (and mpi under
// mpirun), GPT tiny, 10 steps; every rank's losses and parameter pieces against the
// single-device run computed here. And a rank killed mid-step: the others stop within the
// configured timeout, naming the collective and the rank.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "launch/spawn.h"
#include "tests/support/reference_run.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using launch::ProcessResult;

const std::string kWorker = std::string(LOOM_BINARY_DIR) + "/bin/train_worker";

// The single-device run of the workers' config (train_worker.cc) with `layers` layers.
const testing_support::Reference& single_device(int layers = 2) {
  static std::map<int, testing_support::Reference> runs;
  auto it = runs.find(layers);
  if (it != runs.end()) return it->second;
  auto c = parse_config(R"(run: {seed: 3, steps: 10}
model: {type: gpt, preset: tiny}
batch: {global: 8, micro: 2}
optimizer: {type: sgd, lr: 0.3, momentum: 0.9, weight_decay: 0.01, clip_grad_norm: 1.0}
)",
                        "ref.yaml", {"model.args.layers=" + std::to_string(layers)});
  EXPECT_TRUE(c.ok()) << c.error().message;
  return runs.emplace(layers, testing_support::train_single_device(*c, 10)).first->second;
}

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::path(testing::TempDir()) / ("loom_mp_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void check_outputs(const fs::path& dir, int world_size, int layers = 2) {
  // The key bias only follows rounding noise; see distributed_test.cc.
  EXPECT_GT(testing_support::expect_worker_results_equal(single_device(layers), dir, world_size,
                                                         {"attn.k.b"}),
            0);
}

void expect_gloo_equal(const std::string& name, const std::vector<std::string>& overrides,
                       int world_size, int layers = 2) {
  fs::path dir = fresh_dir(name);
  std::vector<std::string> args = overrides;
  args.push_back("comm.backend=gloo");
  args.push_back("--out");
  args.push_back(dir.string());
  args.push_back("model.args.layers=" + std::to_string(layers));
  auto results = launch::spawn_workers(kWorker, world_size, args, 120);
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << launch::describe(results);
  check_outputs(dir, world_size, layers);
}

TEST(GlooRanks, Dp2) { expect_gloo_equal("dp2", {"parallel.dp=2"}, 2); }
TEST(GlooRanks, Tp2) { expect_gloo_equal("tp2", {"parallel.tp=2"}, 2); }
TEST(GlooRanks, Tp2Sp) { expect_gloo_equal("tp2sp", {"parallel.tp=2", "parallel.sp=true"}, 2); }
TEST(GlooRanks, Pp2) { expect_gloo_equal("pp2", {"parallel.pp=2"}, 2); }
TEST(GlooRanks, ChimeraTp2Pp2) {
  expect_gloo_equal("chimera", {"parallel.tp=2", "parallel.pp=2", "parallel.schedule=chimera"}, 4);
}
// ZB-H1 on two processes: I and W blocks, the weight products deferred to W.
TEST(GlooRanks, ZbH1Pp2) {
  expect_gloo_equal("zbh1", {"parallel.pp=2", "parallel.schedule=zb-h1"}, 2);
}
// A schedule `loom schedule --csv` exports (interleaved 1F1B, pp2 x 2 chunks: 4 stages of one
// layer) trains through parallel.schedule_csv on two processes. The workers do read the file: a
// 1F1B one (2 stages) in its place stops them, naming the key.
TEST(GlooRanks, InterleavedFromLoomScheduleCsv) {
  const fs::path dir = fresh_dir("interleaved_csv");
  auto export_csv = [](const std::string& kind_args, const fs::path& csv) {
    const std::string cmd = std::string(LOOM_BINARY_DIR) + "/bin/loom schedule " + kind_args +
                            " --stages 2 --micro-batches 4 --csv " + csv.string() + " > /dev/null";
    return std::system(cmd.c_str());
  };
  const fs::path interleaved = dir / "interleaved.csv", one_f_one_b = dir / "1f1b.csv";
  ASSERT_EQ(export_csv("--kind interleaved --chunks 2", interleaved), 0);
  ASSERT_EQ(export_csv("--kind 1f1b", one_f_one_b), 0);
  const std::vector<std::string> keys = {"parallel.pp=2", "parallel.chunks=2",
                                         "parallel.schedule=csv"};
  auto with_csv = [&](const fs::path& csv) {
    std::vector<std::string> args = keys;
    args.push_back("parallel.schedule_csv=" + csv.string());
    return args;
  };
  expect_gloo_equal("interleaved_csv_run", with_csv(interleaved), 2, 4);

  std::vector<std::string> args = with_csv(one_f_one_b);
  for (const char* more : {"model.args.layers=4", "comm.backend=gloo", "--out"})
    args.push_back(more);
  args.push_back((dir / "refused").string());
  for (const auto& r : launch::spawn_workers(kWorker, 2, args, 120)) {
    EXPECT_FALSE(r.ok()) << r.describe();
    EXPECT_NE(r.output.find("parallel.schedule_csv"), std::string::npos) << r.output;
  }
}
// A compute CSV in torch.distributed.pipelining's names from before it called the input
// gradient I (a looped zero-bubble schedule: each split backward a B followed, later, by its W)
// trains on two processes equal to one device; `loom schedule --from-csv` says how it read it.
TEST(GlooRanks, LoopedZeroBubbleFromTorchsOlderCsv) {
  const fs::path dir = fresh_dir("torch_older_csv");
  const fs::path csv = dir / "zb_older_names.csv";
  std::ofstream(csv)
      << "0F0,0F1,2F0,2F1,0F2,2B0,0F3,2B1,2W0,2F2,0B0,2W1,2F3,0B1,0W0,2B2,0W1,2B3,2W2,0B2,2W3,"
         "0B3,0W2,0W3\n"
         ",1F0,1F1,3F0,3B0,3F1,3B1,3W0,1F2,1B0,3W1,1F3,1B1,1W0,3F2,3B2,1W1,3F3,3B3,3W2,1B2,3W3,"
         "1B3,1W2,1W3\n";
  const fs::path said = dir / "schedule.txt";
  const std::string cmd = std::string(LOOM_BINARY_DIR) + "/bin/loom schedule --from-csv " +
                          csv.string() + " > " + said.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::stringstream text;
  text << std::ifstream(said).rdbuf();
  EXPECT_NE(text.str().find("actions        B + W (torch's names before"), std::string::npos)
      << text.str();
  expect_gloo_equal("torch_older_csv_run",
                    {"parallel.pp=2", "parallel.chunks=2", "parallel.schedule=csv",
                     "parallel.schedule_csv=" + csv.string()},
                    2, 4);
}
TEST(GlooRanks, Dp2Tp2) { expect_gloo_equal("dp2tp2", {"parallel.dp=2", "parallel.tp=2"}, 4); }
TEST(GlooRanks, Tp2Pp2) { expect_gloo_equal("tp2pp2", {"parallel.tp=2", "parallel.pp=2"}, 4); }
TEST(GlooRanks, Dp2Pp2) { expect_gloo_equal("dp2pp2", {"parallel.dp=2", "parallel.pp=2"}, 4); }
TEST(GlooRanks, Dp2Tp2Pp2) {
  expect_gloo_equal("dp2tp2pp2", {"parallel.dp=2", "parallel.tp=2", "parallel.pp=2"}, 8);
}

// `loom plan` writes plan.json; workers started with --plan run exactly it (no planning of
// their own) and still match the single device.
TEST(GlooRanks, Tp2Pp2FromPlanJson) {
  fs::path dir = fresh_dir("tp2pp2_plan");
  // The workers' config (train_worker.cc): the keys a plan is made from must match.
  std::ofstream(dir / "worker.yaml")
      << "model: {type: gpt, preset: tiny}\nbatch: {global: 8, micro: 2}\n";
  const std::string plan_cmd =
      std::string(LOOM_BINARY_DIR) + "/bin/loom plan " + (dir / "worker.yaml").string() +
      " parallel.tp=2 parallel.pp=2 --out " + (dir / "plan").string() + " > /dev/null";
  ASSERT_EQ(std::system(plan_cmd.c_str()), 0);
  auto results =
      launch::spawn_workers(kWorker, 4,
                            {"parallel.tp=2", "parallel.pp=2", "comm.backend=gloo", "--plan",
                             (dir / "plan" / "plan.json").string(), "--out", dir.string()},
                            120);
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << launch::describe(results);
  check_outputs(dir, 4);
}

// The memory `loom plan` estimates for each rank (summary.json) against the peak of live tensor
// bytes the rank measured while training (its own process): within 15%.
void expect_memory_estimate(const std::string& name, const std::vector<std::string>& overrides,
                            int world_size) {
  fs::path dir = fresh_dir("mem_" + name);
  std::ofstream(dir / "worker.yaml")
      << "model: {type: gpt, preset: tiny}\nbatch: {global: 8, micro: 2}\n"
         "optimizer: {type: sgd, lr: 0.3, momentum: 0.9, weight_decay: 0.01, clip_grad_norm: "
         "1.0}\n";
  std::string plan_cmd =
      std::string(LOOM_BINARY_DIR) + "/bin/loom plan " + (dir / "worker.yaml").string();
  for (const auto& o : overrides) plan_cmd += " " + o;
  plan_cmd += " --no-plan-json --out " + (dir / "plan").string() + " > /dev/null";
  ASSERT_EQ(std::system(plan_cmd.c_str()), 0);
  std::ifstream summary_in(dir / "plan" / "summary.json");
  nlohmann::json summary = nlohmann::json::parse(summary_in);

  std::vector<std::string> args = overrides;
  for (const char* a : {"comm.backend=gloo", "--steps", "3", "--out"}) args.push_back(a);
  args.push_back(dir.string());
  // The gpt2-124m widths take 60-90 s on two loaded cores; ctest allows the test 200 s.
  auto results = launch::spawn_workers(kWorker, world_size, args, 180);
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << launch::describe(results);
  for (int r = 0; r < world_size; ++r) {
    std::ifstream idx(dir / ("rank_" + std::to_string(r) + ".json"));
    nlohmann::json index = nlohmann::json::parse(idx);
    double measured = 0;
    for (const auto& p : index["peak_mem_bytes"]) measured = std::max(measured, p.get<double>());
    const double estimate = summary["ranks"][r]["peak_bytes"].get<double>();
    EXPECT_GT(measured, 0) << "rank " << r;
    EXPECT_LE(std::abs(estimate - measured) / measured, 0.15)
        << name << " rank " << r << ": estimated " << estimate << " bytes, measured " << measured;
  }
}

TEST(MemoryEstimate, Tp2) { expect_memory_estimate("tp2", {"parallel.tp=2"}, 2); }
TEST(MemoryEstimate, Pp2) { expect_memory_estimate("pp2", {"parallel.pp=2"}, 2); }
TEST(MemoryEstimate, Dp2) { expect_memory_estimate("dp2", {"parallel.dp=2"}, 2); }
TEST(MemoryEstimate, Tp2Pp2) {
  expect_memory_estimate("tp2pp2", {"parallel.tp=2", "parallel.pp=2"}, 4);
}

// gpt2-124m's widths with 2 layers and 32 tokens (the 50304-token vocabulary splits over tp):
// parameters, the tied embedding's gradients and the optimizer dominate.
const std::vector<std::string> k124m = {"model.preset=gpt2-124m", "model.args.layers=2",
                                        "model.args.seq=32", "model.args.vocab=50304"};
std::vector<std::string> with_124m(std::vector<std::string> plan) {
  plan.insert(plan.begin(), k124m.begin(), k124m.end());
  return plan;
}
TEST(MemoryEstimate, Gpt2Tp2) {
  expect_memory_estimate("124m_tp2", with_124m({"parallel.tp=2"}), 2);
}
TEST(MemoryEstimate, Gpt2Pp2) {
  expect_memory_estimate("124m_pp2", with_124m({"parallel.pp=2"}), 2);
}
TEST(MemoryEstimate, Gpt2Dp2) {
  expect_memory_estimate("124m_dp2", with_124m({"parallel.dp=2"}), 2);
}
// ZeRO-1: each replica keeps the optimizer state of the pieces it owns (here the SGD momentum of
// about half the parameters).
TEST(MemoryEstimate, Gpt2Dp2Zero1) {
  expect_memory_estimate("124m_dp2_zero1", with_124m({"parallel.dp=2", "parallel.zero=1"}), 2);
}
// ZeRO-3: each replica stores half of every parameter (and its gradient and momentum); the
// gathered weights live one at a time, with the next one gathered ahead.
TEST(MemoryEstimate, Gpt2Dp2Zero3) {
  expect_memory_estimate("124m_dp2_zero3", with_124m({"parallel.dp=2", "parallel.zero=3"}), 2);
}
// Full recomputation on a model whose activations dominate (4 layers, hidden 256, 256 tokens):
// each layer keeps its input; one layer's activations come back in its backward.
TEST(MemoryEstimate, RecomputeFull) {
  expect_memory_estimate("recompute_full",
                         {"model.args.layers=4", "model.args.hidden=256", "model.args.heads=4",
                          "model.args.seq=256", "model.args.vocab=4096", "parallel.recompute=full"},
                         1);
}

void expect_mpi_equal(const std::string& name, const std::vector<std::string>& overrides,
                      int world_size) {
  if (launch::find_program("mpirun").empty()) GTEST_SKIP() << "mpirun is not installed";
  fs::path dir = fresh_dir("mpi_" + name);
  launch::Launch launch;
  launch.argv = launch::mpirun_argv();
  launch.argv.insert(launch.argv.end(), {"-np", std::to_string(world_size), kWorker});
  launch.env = {{"OMP_NUM_THREADS", "1"}};
  for (const auto& o : overrides) launch.argv.push_back(o);
  launch.argv.insert(launch.argv.end(), {"comm.backend=mpi", "--out", dir.string()});
  auto results = launch::run_processes({launch}, 120);
  ASSERT_TRUE(results[0].ok()) << results[0].describe();
  check_outputs(dir, world_size);
}

TEST(MpiRanks, Dp2) { expect_mpi_equal("dp2", {"parallel.dp=2"}, 2); }
TEST(MpiRanks, Tp2) { expect_mpi_equal("tp2", {"parallel.tp=2"}, 2); }
TEST(MpiRanks, Pp2) { expect_mpi_equal("pp2", {"parallel.pp=2"}, 2); }

TEST(Faults, AKilledRankStopsTheOthersWithinTheTimeout) {
  auto results = launch::spawn_workers(kWorker, 2,
                                       {"parallel.dp=2", "comm.backend=gloo", "comm.timeout_s=4",
                                        "--die-at-step", "3", "--die-rank", "1"},
                                       60);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[1].signal, 9) << results[1].describe();
  const ProcessResult& survivor = results[0];
  EXPECT_FALSE(survivor.ok());
  EXPECT_FALSE(survivor.killed) << "rank 0 hung until the test's deadline";
  EXPECT_LT(survivor.elapsed_s, 20.0);  // start-up, two steps, the 4 s timeout and a margin
  EXPECT_NE(survivor.output.find("rank 1"), std::string::npos) << survivor.output;
  EXPECT_TRUE(survivor.output.find("all_reduce") != std::string::npos ||
              survivor.output.find("recv") != std::string::npos)
      << survivor.output;
}

}  // namespace
}  // namespace loom
