// Checkpoints across plans and processes: saved under dp2 x tp2 at step 5 (gloo, 4 ranks) and
// resumed under pp4 (gloo, 4 ranks) and on one rank, steps 6-10 equal the uninterrupted
// single-device run; a worker killed mid-step under loomrun --max-restarts 1 restarts from the
// latest checkpoint and ends with the uninterrupted run's losses.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/checkpoint_reader.h"
#include "exec/runtime/trainer.h"
#include "tests/exec/comm/spawn.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

const std::string kWorker = std::string(LOOM_BINARY_DIR) + "/bin/train_worker";
const std::string kLoom = std::string(LOOM_BINARY_DIR) + "/bin/loom";
const std::string kLoomrun = std::string(LOOM_BINARY_DIR) + "/bin/loomrun";

// train_worker's config with four layers, so that pp4 has a layer per stage.
const char* kYaml = R"(run: {seed: 3, steps: 10}
model: {type: gpt, preset: tiny, args: {layers: 4}}
batch: {global: 8, micro: 2}
optimizer: {type: sgd, lr: 0.3, momentum: 0.9, weight_decay: 0.01, clip_grad_norm: 1.0}
comm: {timeout_s: 60}
)";

const std::vector<double>& uninterrupted() {
  static std::vector<double> losses = [] {
    std::vector<double> out;
    auto c = parse_config(kYaml, "ref.yaml");
    auto t = runtime::Trainer::create(*c);
    for (int i = 0; i < 10; ++i) out.push_back((*t)->step()->loss);
    return out;
  }();
  return losses;
}

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::path(testing::TempDir()) / ("loom_ckpt_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Rank 0's losses, by step.
std::map<int64_t, double> worker_losses(const fs::path& out) {
  std::ifstream in(out / "rank_0.json");
  EXPECT_TRUE(in) << "rank 0 wrote no results in " << out;
  std::map<int64_t, double> by_step;
  if (!in) return by_step;
  nlohmann::json j = nlohmann::json::parse(in);
  int64_t step = j["first_step"];
  for (double l : j["losses"]) by_step[step++] = l;
  return by_step;
}

void run_workers(int world, std::vector<std::string> args, const fs::path& out) {
  args.insert(args.end(), {"model.args.layers=4", "comm.backend=gloo", "--out", out.string()});
  auto results = comm::testing::spawn_workers(kWorker, world, args, 150);
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << comm::testing::describe(results);
}

void expect_equal_losses(const std::map<int64_t, double>& got, int64_t first, int64_t last,
                         double tol, const std::string& what) {
  const auto& ref = uninterrupted();
  for (int64_t s = first; s <= last; ++s) {
    ASSERT_TRUE(got.count(s)) << what << ": no loss for step " << s;
    EXPECT_LE(std::abs(got.at(s) - ref[s - 1]) / ref[s - 1], tol)
        << what << " step " << s << ": " << got.at(s) << " vs " << ref[s - 1];
  }
}

TEST(CheckpointReshard, SavedDp2Tp2ResumesUnderPp4AndOneRank) {
  const fs::path ckpt = fresh_dir("reshard") / "ckpt";
  const fs::path saved = fresh_dir("reshard_save");
  run_workers(4,
              {"parallel.dp=2", "parallel.tp=2", "checkpoint.dir=" + ckpt.string(),
               "checkpoint.every=5", "--steps", "5"},
              saved);
  expect_equal_losses(worker_losses(saved), 1, 5, 1e-5, "dp2 x tp2");
  ASSERT_TRUE(fs::exists(ckpt / "step_00000005" / "manifest.json"));
  auto reader = CheckpointReader::open(ckpt / "step_00000005");
  ASSERT_TRUE(reader.ok()) << reader.error().message;
  EXPECT_EQ(reader->manifest().world_size, 4);
  EXPECT_EQ(reader->manifest().samples_seen, 40);

  // pp4 on 4 ranks: every stage reads its layers' slices out of the tp halves.
  const fs::path pp4 = fresh_dir("reshard_pp4");
  run_workers(4, {"parallel.pp=4", "checkpoint.resume=" + ckpt.string(), "--steps", "10"}, pp4);
  auto pp4_losses = worker_losses(pp4);
  EXPECT_EQ(pp4_losses.begin()->first, 6);
  expect_equal_losses(pp4_losses, 6, 10, 1e-6, "resumed under pp4");

  // One rank, in this process.
  auto c =
      parse_config(kYaml, "one.yaml", {"checkpoint.resume=" + (ckpt / "step_00000005").string()});
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto t = runtime::Trainer::create(*c);
  ASSERT_TRUE(t.ok()) << t.error().message;
  ASSERT_EQ((*t)->steps_done(), 5);
  std::map<int64_t, double> one;
  for (int64_t s = 6; s <= 10; ++s) one[s] = (*t)->step()->loss;
  expect_equal_losses(one, 6, 10, 1e-6, "resumed on one rank");
}

// Rank 1 is SIGKILLed in the middle of step 5 on the first attempt; loomrun restarts the group,
// which resumes from the checkpoint of step 4 and finishes.
TEST(CheckpointFaults, AWorkerKilledMidStepRestartsFromTheLatestCheckpoint) {
  const fs::path dir = fresh_dir("restart");
  const fs::path config = dir / "run.yaml";
  std::ofstream(config) << kYaml;
  comm::testing::Launch launch;
  launch.argv = {kLoomrun,
                 "--standalone",
                 "--nproc-per-node",
                 "2",
                 "--max-restarts",
                 "1",
                 kLoom,
                 "train",
                 config.string(),
                 "parallel.dp=2",
                 "comm.backend=gloo",
                 "comm.timeout_s=20",
                 "run.output_dir=" + (dir / "run").string(),
                 "checkpoint.every=2",
                 "checkpoint.resume=latest"};
  launch.env = {
      {"LOOM_DEBUG_KILL_AT_STEP", "5"}, {"LOOM_DEBUG_KILL_RANK", "1"}, {"OMP_NUM_THREADS", "1"}};
  auto results = comm::testing::run_processes({launch}, 200);
  ASSERT_TRUE(results[0].ok()) << results[0].describe();
  EXPECT_NE(results[0].output.find("SIGKILL"), std::string::npos) << results[0].describe();
  EXPECT_NE(results[0].output.find("resumed from step 4"), std::string::npos)
      << results[0].describe();
  // metrics.jsonl holds both attempts; the last line of each step is the one that counts.
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  std::map<int64_t, double> losses;
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    losses[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  ASSERT_EQ(losses.size(), 10u);
  expect_equal_losses(losses, 1, 10, 1e-5, "after the restart");
  auto kept = complete_checkpoints(dir / "run" / "checkpoints");
  ASSERT_EQ(kept.size(), 2u);  // checkpoint.keep
  EXPECT_EQ(kept.back().first, 10);
}

}  // namespace
}  // namespace loom
