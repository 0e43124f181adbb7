// Checkpoints across plans and processes: saved under dp2 x tp2 at step 5 (gloo, 4 ranks) and
// resumed under pp4 (gloo, 4 ranks) and on one rank, steps 6-10 equal the uninterrupted
// single-device run; a worker killed mid-step under loomrun --max-restarts 1 restarts from the
// latest checkpoint and ends with the uninterrupted run's losses; the same config started on half
// the ranks goes on as one run (an elastic restart). The merged checkpoint parses
// with a safetensors reader written here. The writer killed at every
// point of writing, and at random instants, leaves the previous checkpoint loadable.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "checkpoint/reader.h"
#include "launch/planned_trainer.h"
#include "launch/spawn.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"
#include "tests/support/loomrun_agents.h"
#include "tests/support/reference_run.h"

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
    auto t = launch::create_trainer(*c);
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

// The thread settings of every `loom train` these tests compare bitwise: pinned, so the
// processes run the same code whatever the machine's cores (see tests/README.md).
const std::map<std::string, std::string> kPinnedThreads = {{"OMP_NUM_THREADS", "1"},
                                                           {"OPENBLAS_NUM_THREADS", "1"}};

// The losses in a run directory's metrics.jsonl, by step (the last line of a step counts).
std::map<int64_t, double> metrics_losses(const fs::path& run) {
  std::ifstream metrics(run / "metrics.jsonl");
  std::map<int64_t, double> losses;
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    losses[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return losses;
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
  auto results = launch::spawn_workers(kWorker, world, args, 150);
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << launch::describe(results);
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

void expect_merged_equals_single_device(const fs::path& ckpt);

TEST(CheckpointReshard, SavedDp2Tp2ResumesUnderPp4AndOneRank) {
  const fs::path ckpt = fresh_dir("reshard") / "ckpt";
  const fs::path saved = fresh_dir("reshard_save");
  run_workers(4,
              {"parallel.dp=2", "parallel.tp=2", "checkpoint.dir=" + ckpt.string(),
               "checkpoint.every=5", "--steps", "5"},
              saved);
  expect_equal_losses(worker_losses(saved), 1, 5, testing_support::kLossRelTolerance, "dp2 x tp2");
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
  expect_equal_losses(pp4_losses, 6, 10, testing_support::kLossRelTolerance, "resumed under pp4");

  // One rank, in this process.
  auto c =
      parse_config(kYaml, "one.yaml", {"checkpoint.resume=" + (ckpt / "step_00000005").string()});
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto t = launch::create_trainer(*c);
  ASSERT_TRUE(t.ok()) << t.error().message;
  ASSERT_EQ((*t)->steps_done(), 5);
  std::map<int64_t, double> one;
  for (int64_t s = 6; s <= 10; ++s) one[s] = (*t)->step()->loss;
  expect_equal_losses(one, 6, 10, testing_support::kLossRelTolerance, "resumed on one rank");

  expect_merged_equals_single_device(ckpt);
}

// A safetensors reader written from the format's description alone (not checkpoint/safetensors.h):
// 8 bytes little-endian header length, a JSON header, raw little-endian data.
struct IndependentTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<float> values;
};
std::map<std::string, IndependentTensor> read_safetensors_independently(const fs::path& path,
                                                                        nlohmann::json* metadata) {
  std::ifstream in(path, std::ios::binary);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  EXPECT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(bytes[static_cast<size_t>(i)]) << (8 * i);
  EXPECT_LE(8 + n, bytes.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "the data section should start 8-byte aligned";
  nlohmann::json header =
      nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
  std::map<std::string, IndependentTensor> out;
  uint64_t expected_begin = 0;  // standard readers require a dense, ordered data section
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      *metadata = it.value();
      continue;
    }
    IndependentTensor t;
    t.dtype = it.value()["dtype"];
    t.shape = it.value()["shape"].get<std::vector<int64_t>>();
    const uint64_t b = it.value()["data_offsets"][0], e = it.value()["data_offsets"][1];
    spans.emplace_back(b, e);
    EXPECT_EQ(t.dtype, "F32") << it.key();
    int64_t count = 1;
    for (int64_t d : t.shape) count *= d;
    EXPECT_EQ(e - b, static_cast<uint64_t>(count) * 4) << it.key();
    t.values.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      uint32_t bits = 0;
      for (int k = 0; k < 4; ++k)
        bits |= static_cast<uint32_t>(
                    bytes[8 + n + b + static_cast<uint64_t>(i) * 4 + static_cast<uint64_t>(k)])
                << (8 * k);
      std::memcpy(&t.values[static_cast<size_t>(i)], &bits, 4);
    }
    out[it.key()] = std::move(t);
  }
  std::sort(spans.begin(), spans.end());
  for (const auto& [b, e] : spans) {
    EXPECT_EQ(b, expected_begin) << "gap or overlap in the data section";
    expected_begin = e;
  }
  EXPECT_EQ(8 + n + expected_begin, bytes.size()) << "trailing bytes after the last tensor";
  return out;
}

// `loom checkpoint merge` of the dp2 x tp2 checkpoint: one file with every full parameter equal
// to the single-device run's at step 5, and the momentum buffers whole; `inspect` lists shards.
void expect_merged_equals_single_device(const fs::path& ckpt) {
  const fs::path out = ckpt.parent_path() / "merged.safetensors";
  launch::Launch merge;
  merge.argv = {kLoom, "checkpoint", "merge", ckpt.string(), out.string()};
  auto r = launch::run_processes({merge}, 60)[0];
  ASSERT_TRUE(r.ok()) << r.describe();
  nlohmann::json metadata;
  auto tensors = read_safetensors_independently(out, &metadata);
  EXPECT_EQ(metadata["format"], "loom-merged");
  EXPECT_EQ(metadata["step"], "5");

  auto c = parse_config(kYaml, "ref.yaml");
  const testing_support::Reference ref = testing_support::train_single_device(*c, 5);
  int params = 0;
  auto t = launch::create_trainer(*c);
  for (const auto& full : (*t)->graph().tensors()) {
    if (full.role != graph::TensorRole::kParameter) continue;
    ++params;
    ASSERT_TRUE(tensors.count(full.name)) << full.name << " is not in the merged file";
    const IndependentTensor& got = tensors.at(full.name);
    EXPECT_EQ(got.shape, full.shape) << full.name;
    const at::Tensor& want = ref.params.at(full.name);
    at::Tensor have =
        at::from_blob(const_cast<float*>(got.values.data()), want.sizes(), at::kFloat);
    // The key bias's gradient is rounding noise by construction (it shifts every softmax score
    // alike): its value is not compared, only its presence and shape.
    const auto differs = testing_support::is_noise(full.name, {"attn.k.b"})
                             ? std::nullopt
                             : testing_support::compare_parameter(
                                   have, want, ref.init.at(full.name),
                                   testing_support::parameter_tolerance(ref.trace, full.name));
    EXPECT_FALSE(differs) << full.name << ": " << differs.value_or("");
    ASSERT_TRUE(tensors.count("optimizer.exp_avg." + full.name)) << full.name;
    EXPECT_EQ(tensors.at("optimizer.exp_avg." + full.name).shape, full.shape) << full.name;
  }
  EXPECT_EQ(tensors.size(), static_cast<size_t>(2 * params));  // parameters and momentum (sgd)

  // The merged file is a checkpoint too: one rank resumes from it with the uninterrupted losses.
  auto from_merged = parse_config(kYaml, "merged.yaml", {"checkpoint.resume=" + out.string()});
  auto resumed = launch::create_trainer(*from_merged);
  ASSERT_TRUE(resumed.ok()) << resumed.error().message;
  ASSERT_EQ((*resumed)->steps_done(), 5);
  std::map<int64_t, double> losses;
  for (int64_t s = 6; s <= 10; ++s) losses[s] = (*resumed)->step()->loss;
  expect_equal_losses(losses, 6, 10, testing_support::kLossRelTolerance,
                      "resumed from the merged file");

  launch::Launch inspect;
  inspect.argv = {kLoom, "checkpoint", "inspect", ckpt.string()};
  auto listing = launch::run_processes({inspect}, 60)[0];
  ASSERT_TRUE(listing.ok()) << listing.describe();
  for (const char* want : {"dp2 x tp2 x pp1", "rank_00003.safetensors", "h0.mlp.fc1.w", "exp_avg"})
    EXPECT_NE(listing.output.find(want), std::string::npos) << want << " not in:\n"
                                                            << listing.output;
}

// Rank 1 is SIGKILLed in the middle of step 5 on the first attempt; loomrun restarts the group,
// which resumes from the checkpoint of step 4 and finishes.
TEST(CheckpointFaults, AWorkerKilledMidStepRestartsFromTheLatestCheckpoint) {
  const fs::path dir = fresh_dir("restart");
  const fs::path config = dir / "run.yaml";
  std::ofstream(config) << kYaml;
  launch::Launch launch;
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
  auto results = launch::run_processes({launch}, 200);
  ASSERT_TRUE(results[0].ok()) << results[0].describe();
  EXPECT_NE(results[0].output.find("SIGKILL"), std::string::npos) << results[0].describe();
  EXPECT_NE(results[0].output.find("resumed from step 4"), std::string::npos)
      << results[0].describe();
  // One metrics.jsonl row per step: rank 0 may finish step 5, in which rank 1 died, and write its
  // row; the restart resumes from step 4 and replaces it.
  std::vector<int64_t> rows;
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);)
    rows.push_back(nlohmann::json::parse(line)["step"].get<int64_t>());
  EXPECT_EQ(rows, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  const std::map<int64_t, double> losses = metrics_losses(dir / "run");
  ASSERT_EQ(losses.size(), 10u);
  expect_equal_losses(losses, 1, 10, testing_support::kLossRelTolerance, "after the restart");
  auto kept = complete_checkpoints(dir / "run" / "checkpoints");
  ASSERT_EQ(kept.size(), 2u);  // checkpoint.keep
  EXPECT_EQ(kept.back().first, 10);
}

// `loom train` of the elastic tests: the config's dp 2 x tp 2 over gloo, a checkpoint every 2
// steps, resuming the latest; however many ranks it is started on.
std::vector<std::string> elastic_train(const fs::path& config, const fs::path& run) {
  return {kLoom,
          "train",
          config.string(),
          "parallel.dp=2",
          "parallel.tp=2",
          "comm.backend=gloo",
          "comm.timeout_s=30",
          "run.output_dir=" + run.string(),
          "checkpoint.every=2",
          "checkpoint.resume=latest"};
}

// An elastic restart on half the machines: the same config (dp 2 x tp 2) trained on 4 loomrun
// ranks to step 4, then started on 2 ranks, plans dp 1 x tp 2 for them (same global batch, twice
// the micro-batches per rank), resumes the latest checkpoint resharded and trains on to step 8.
// Every step has one metrics row, world_size 4 then 2, and every loss is the uninterrupted one
// device run's within the plan tolerance (a wrong reshard or data order moves it by 1e-3 or
// more).
TEST(ElasticRestart, HalfTheRanksGoOnWithTheSameConfigAsOneRun) {
  const fs::path dir = fresh_dir("elastic");
  const fs::path config = dir / "run.yaml";
  std::ofstream(config) << kYaml;
  auto train = [&](int ranks, int steps) {
    launch::Launch l;
    l.argv = {kLoomrun, "--standalone", "--nproc-per-node", std::to_string(ranks)};
    for (const std::string& a : elastic_train(config, dir / "run")) l.argv.push_back(a);
    l.argv.push_back("run.steps=" + std::to_string(steps));
    l.env = {{"OMP_NUM_THREADS", "1"}};
    return launch::run_processes({l}, 150)[0];
  };
  auto four = train(4, 4);
  ASSERT_TRUE(four.ok()) << four.describe();
  auto two = train(2, 8);
  ASSERT_TRUE(two.ok()) << two.describe();
  EXPECT_NE(two.output.find("started on 2 ranks, the config plans for"), std::string::npos)
      << two.output;
  EXPECT_NE(two.output.find("parallel.dp 2 -> 1"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("resumed from step 4"), std::string::npos) << two.output;
  std::vector<int64_t> rows, worlds;
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    rows.push_back(row["step"].get<int64_t>());
    worlds.push_back(row["world_size"].get<int64_t>());
  }
  EXPECT_EQ(rows, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(worlds, (std::vector<int64_t>{4, 4, 4, 4, 2, 2, 2, 2}));
  expect_equal_losses(metrics_losses(dir / "run"), 1, 8, testing_support::kLossRelTolerance,
                      "dp 2 x tp 2, then dp 1 x tp 2");
}

// The flags of the elastic agents' tests: up to 2 agents of 2 ranks at `port`, 10 s of silence
// loses an agent, one restart after a failure; `env` goes to the workers.
std::vector<std::string> elastic_agent_args(const fs::path& dir, int port,
                                            const std::vector<std::string>& flags,
                                            const std::vector<std::string>& env) {
  std::vector<std::string> args = {"--nnodes",
                                   "1:2",
                                   "--nproc-per-node",
                                   "2",
                                   "--rdzv-endpoint",
                                   "127.0.0.1:" + std::to_string(port),
                                   "--rdzv-timeout",
                                   "60",
                                   "--rdzv-last-call",
                                   "1",
                                   "--heartbeat-timeout",
                                   "10",
                                   "--max-restarts",
                                   "1"};
  args.insert(args.end(), flags.begin(), flags.end());
  args.push_back("/usr/bin/env");
  args.push_back("OMP_NUM_THREADS=1");
  args.insert(args.end(), env.begin(), env.end());
  for (const std::string& a : elastic_train(dir / "run.yaml", dir / "run")) args.push_back(a);
  return args;
}

// Two agents started on `args` (the first hosts the store, so the second is the one that may be
// lost); the second is SIGKILLed with its workers once step 3 is recorded.
testing_support::Agent start_two_and_kill_one(const fs::path& dir, int port,
                                              const std::vector<std::string>& args) {
  using namespace testing_support;
  Agent host = start_agent(dir.string(), "host", args);
  EXPECT_TRUE(eventually([&] { return accepts(port); }, 30)) << host.stderr_text();
  Agent other = start_agent(dir.string(), "other", args);
  // Every step needs all four ranks, so the run cannot end before the kill lands.
  const fs::path metrics = dir / "run" / "metrics.jsonl";
  EXPECT_TRUE(eventually([&] { return lines_of(metrics.string()).size() >= 3; }, 90))
      << host.stderr_text() << other.stderr_text();
  EXPECT_EQ(kill(-other.pid, SIGKILL), 0);  // the agent and its workers, as a lost node
  EXPECT_EQ(other.wait(20), 128 + SIGKILL);
  return host;
}

// metrics.jsonl's steps and world sizes, in order.
std::pair<std::vector<int64_t>, std::vector<int64_t>> steps_and_worlds(const fs::path& run) {
  std::vector<int64_t> rows, worlds;
  for (const std::string& line : testing_support::lines_of((run / "metrics.jsonl").string())) {
    const nlohmann::json row = nlohmann::json::parse(line);
    rows.push_back(row["step"].get<int64_t>());
    worlds.push_back(row["world_size"].get<int64_t>());
  }
  return {rows, worlds};
}

// Two loomrun agents of 2 ranks each (dp 2 x tp 2 over gloo) meet at an elastic rendezvous; the
// second is SIGKILLed with its workers once step 3 is recorded. The survivor restarts its workers
// on 2 ranks, which plan dp 1 x tp 2 for the same config, resume the latest checkpoint resharded
// and finish: every step has one metrics row, world_size 4 up to the checkpoint resumed and 2
// after it, and every loss is the uninterrupted one-device run's within the plan tolerance.
TEST(ElasticRestart, AnAgentKilledMidRunLeavesTheSurvivorToFinishOnHalfTheRanks) {
  using namespace testing_support;  // the agents
  const fs::path dir = fresh_dir("elastic_agents");
  std::ofstream(dir / "run.yaml") << kYaml;
  const int port = free_port();
  Agent host = start_two_and_kill_one(dir, port, elastic_agent_args(dir, port, {}, {}));
  ASSERT_EQ(host.wait(150), 0) << host.stderr_text();
  const std::string log = host.stderr_text() + read_file((dir / "host.out").string());
  EXPECT_NE(log.find("round 1: 1 node(s), world size 2"), std::string::npos) << log;
  EXPECT_NE(log.find("parallel.dp 2 -> 1"), std::string::npos) << log;
  const auto [rows, worlds] = steps_and_worlds(dir / "run");
  EXPECT_EQ(rows, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  // 4 up to a checkpoint (an even step, at least 2), 2 from the step after it.
  const auto first_two = std::find(worlds.begin(), worlds.end(), 2);
  ASSERT_NE(first_two, worlds.end()) << "no step ran on the survivor";
  const auto resumed_at = first_two - worlds.begin();
  EXPECT_GE(resumed_at, 2);
  EXPECT_EQ(resumed_at % 2, 0);
  EXPECT_TRUE(std::all_of(worlds.begin(), first_two, [](int64_t w) { return w == 4; }));
  EXPECT_TRUE(std::all_of(first_two, worlds.end(), [](int64_t w) { return w == 2; }));
  expect_equal_losses(metrics_losses(dir / "run"), 1, 10, testing_support::kLossRelTolerance,
                      "dp 2 x tp 2 on two agents, then dp 1 x tp 2 on the survivor");
}

// The same with checkpoint.async, and the lost agent comes back (a new loomrun with the same
// flags) while the survivor trains on 2 ranks. With --scale-up the survivor's workers stop after
// their step and its checkpoint, and the next round of both agents plans dp 2 x tp 2 again and
// resumes it. The survivor's round holds its second step until that stop
// (LOOM_DEBUG_HOLD_ON_RESTART), so the newcomer always arrives mid-run: world_size is 4, then 2 for
// exactly those two steps, then 4; every step has one row and every loss is the one-device run's.
TEST(ElasticRestart, AnAgentComingBackIsAdmittedWithScaleUp) {
  using namespace testing_support;  // the agents
  const fs::path dir = fresh_dir("elastic_scale_up");
  std::ofstream(dir / "run.yaml") << kYaml;
  const int port = free_port();
  // The periodic checkpoints are written in the background (checkpoint.async) by 4 and by 2
  // gloo processes, and resharded across both changes of the world.
  auto args = elastic_agent_args(dir, port, {"--scale-up"}, {"LOOM_DEBUG_HOLD_ON_RESTART=1"});
  args.push_back("checkpoint.async=true");
  Agent host = start_two_and_kill_one(dir, port, args);
  ASSERT_TRUE(eventually(
      [&] {
        const auto worlds = steps_and_worlds(dir / "run").second;
        return std::count(worlds.begin(), worlds.end(), 2) >= 1;
      },
      90))
      << host.stderr_text();
  Agent back = start_agent(dir.string(), "back", args);
  ASSERT_EQ(host.wait(150), 0) << host.stderr_text();
  EXPECT_EQ(back.wait(30), 0) << back.stderr_text();
  const std::string log = host.stderr_text();
  EXPECT_NE(log.find("ended for a scale-up: agent "), std::string::npos) << log;
  EXPECT_NE(log.find("round 2: 2 node(s), world size 4"), std::string::npos) << log;
  const auto [rows, worlds] = steps_and_worlds(dir / "run");
  EXPECT_EQ(rows, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  const auto first_two = std::find(worlds.begin(), worlds.end(), 2);
  ASSERT_NE(first_two, worlds.end()) << "no step ran on the survivor";
  ASSERT_LE(first_two - worlds.begin(), 6) << "the survivor resumed too late to scale up";
  EXPECT_TRUE(std::all_of(worlds.begin(), first_two, [](int64_t w) { return w == 4; }));
  EXPECT_EQ(std::vector<int64_t>(first_two, first_two + 2), (std::vector<int64_t>{2, 2}));
  EXPECT_TRUE(std::all_of(first_two + 2, worlds.end(), [](int64_t w) { return w == 4; }));
  expect_equal_losses(metrics_losses(dir / "run"), 1, 10, testing_support::kLossRelTolerance,
                      "dp 2 x tp 2, dp 1 x tp 2 on the survivor, dp 2 x tp 2 with the agent back");
}

// Every complete checkpoint under `root` reads back whole (sizes, CRC-32, coverage); returns
// the newest step, 0 when there is none.
int64_t check_complete_checkpoints(const fs::path& root) {
  int64_t newest = 0;
  for (const auto& [step, dir] : complete_checkpoints(root)) {
    auto reader = CheckpointReader::open(dir);
    EXPECT_TRUE(reader.ok()) << reader.error().message;
    if (!reader.ok()) continue;
    for (const char* kind : {kSliceParam, kSliceExpAvg})
      for (const auto& name : reader->tensors(kind)) {
        auto [shape, dtype] = *reader->describe(name, kind);
        SliceRanges all;
        for (int64_t d : shape) all.emplace_back(0, d);
        auto bytes = reader->read(name, kind, all);
        EXPECT_TRUE(bytes.ok()) << bytes.error().message;
      }
    newest = std::max(newest, step);
  }
  return newest;
}

// `loom train` on the writer tests' config for 3 steps into `run`, plus `extra`.
launch::Launch train_steps(const fs::path& config, const fs::path& run,
                           const std::vector<std::string>& extra) {
  launch::Launch l;
  l.argv = {kLoom,           "train",
            config.string(), "model.args.layers=2",
            "run.steps=3",   "run.output_dir=" + run.string()};
  l.argv.insert(l.argv.end(), extra.begin(), extra.end());
  l.env = kPinnedThreads;
  return l;
}

// Resumes `root`'s latest checkpoint in a `loom train` started like the one that wrote it and
// trains to step 3: the losses must be the uninterrupted run's exactly (same plan, same code,
// same threads).
void expect_resume_matches(const fs::path& config, const fs::path& root,
                           const std::map<int64_t, double>& want, const std::string& what) {
  const fs::path out = root.parent_path() / "resumed";
  fs::remove_all(out);
  auto r = launch::run_processes(
      {train_steps(config, out, {"checkpoint.resume=latest", "checkpoint.dir=" + root.string()})},
      60)[0];
  ASSERT_TRUE(r.ok()) << what << ": " << r.describe();
  for (const auto& [step, loss] : metrics_losses(out))
    EXPECT_EQ(loss, want.at(step)) << what << " step " << step;
}

class CheckpointWriterKilled : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    config_ = dir_ / "run.yaml";
    std::ofstream(config_) << kYaml;
    // The uninterrupted losses, from a process started as the killed ones are.
    auto r = launch::run_processes({train_steps(config_, dir_ / "uninterrupted", {})}, 60)[0];
    ASSERT_TRUE(r.ok()) << r.describe();
    want_ = metrics_losses(dir_ / "uninterrupted");
    ASSERT_EQ(want_.size(), 3u);
  }
  // `loom train` for 3 steps with a checkpoint after each (keep 2) into a fresh `run`.
  launch::Launch train(const fs::path& run, const std::vector<std::string>& extra = {}) const {
    fs::remove_all(run);
    std::vector<std::string> args = {"checkpoint.every=1", "checkpoint.keep=2"};
    args.insert(args.end(), extra.begin(), extra.end());
    return train_steps(config_, run, args);
  }
  void kill_at_every_point(const std::vector<std::string>& extra);
  fs::path dir_, config_;
  std::map<int64_t, double> want_;
};

// Stops the writer at each point of writing in turn (each file half-written, synced and renamed;
// the manifest; pruning) until a run gets through: the newest complete checkpoint never goes
// back, each one reads back whole, its steps' metrics rows are all there, and resuming it gives
// the uninterrupted losses.
void CheckpointWriterKilled::kill_at_every_point(const std::vector<std::string>& extra) {
  int64_t newest = 0;
  bool finished = false;
  for (int point = 1; point <= 100 && !finished; ++point) {
    const fs::path run = dir_ / "run";
    auto launch = train(run, extra);
    launch.env["LOOM_DEBUG_CKPT_CRASH_AT"] = std::to_string(point);
    auto r = launch::run_processes({launch}, 60)[0];
    finished = r.ok();
    if (!finished) {
      ASSERT_EQ(r.signal, 9) << "crash point " << point << ": " << r.describe();
    }
    const int64_t now = check_complete_checkpoints(run / "checkpoints");
    EXPECT_GE(now, newest) << "crash point " << point << " lost a complete checkpoint";
    // A step's metrics row is durable before its checkpoint commits: resuming never lacks one.
    const auto rows = metrics_losses(run);
    for (int64_t step = 1; step <= now; ++step)
      EXPECT_TRUE(rows.count(step)) << "crash point " << point << ": checkpoint " << now
                                    << " committed without the metrics row of step " << step;
    newest = now;
    if (now > 0)
      expect_resume_matches(config_, run / "checkpoints", want_,
                            "crash point " + std::to_string(point));
  }
  EXPECT_TRUE(finished) << "the writer never got through";
  EXPECT_EQ(newest, 3);
}

TEST_F(CheckpointWriterKilled, AtEveryPointThePreviousCheckpointStaysLoadable) {
  kill_at_every_point({});
}

// The same with checkpoint.async: steps 1 and 2's checkpoints are written on the background
// thread while the next step runs, so most kills land mid-step, with a write in flight.
TEST_F(CheckpointWriterKilled, AtEveryPointOfAnAsyncWriteThePreviousCheckpointStaysLoadable) {
  kill_at_every_point({"checkpoint.async=true"});
}

// Kills the writer at random instants within the span of a whole run (measured first).
TEST_F(CheckpointWriterKilled, AtRandomInstantsThePreviousCheckpointStaysLoadable) {
  auto full = launch::run_processes({train(dir_ / "full")}, 60)[0];
  ASSERT_TRUE(full.ok()) << full.describe();
  const unsigned seed = 20261123;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> when(0.3 * full.elapsed_s, full.elapsed_s);
  int killed = 0;
  for (int i = 0; i < 8; ++i) {
    const double at_s = when(rng);
    const fs::path run = dir_ / ("run" + std::to_string(i));
    auto r = launch::run_processes({train(run)}, at_s)[0];
    killed += r.killed;
    SCOPED_TRACE("seed " + std::to_string(seed) + ", killed after " + std::to_string(at_s) + " s");
    check_complete_checkpoints(run / "checkpoints");
    if (!latest_checkpoint(run / "checkpoints").empty())
      expect_resume_matches(config_, run / "checkpoints", want_,
                            "killed at " + std::to_string(at_s) + " s");
  }
  std::printf("writer killed mid-run in %d of 8 runs\n", killed);
}

// `loom train` resuming a damaged checkpoint, or under another run.seed: exit 2, one message naming
// the file or the key, nothing written.
TEST(CheckpointCli, ACorruptedCheckpointIsRefusedWithExitCode2) {
  const fs::path dir = fresh_dir("cli");
  const fs::path config = dir / "run.yaml";
  std::ofstream(config) << kYaml;
  launch::Launch save;
  save.argv = {kLoom,
               "train",
               config.string(),
               "model.args.layers=2",
               "run.steps=1",
               "checkpoint.every=1",
               "run.output_dir=" + (dir / "first").string()};
  ASSERT_TRUE(launch::run_processes({save}, 60)[0].ok());
  const fs::path shard = dir / "first" / "checkpoints" / "step_00000001" / "rank_00000.safetensors";
  std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(200);
  const char byte = static_cast<char>(f.get());
  f.seekp(200);
  f.put(byte == '\x7f' ? '\x7e' : '\x7f');
  f.close();
  launch::Launch resume;
  resume.argv = {kLoom,
                 "train",
                 config.string(),
                 "model.args.layers=2",
                 "run.steps=2",
                 "checkpoint.resume=" + (dir / "first" / "checkpoints").string(),
                 "run.output_dir=" + (dir / "second").string()};
  auto r = launch::run_processes({resume}, 60)[0];
  EXPECT_EQ(r.exit_code, 2) << r.describe();
  EXPECT_NE(r.output.find(shard.string()), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("corrupted"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "second")) << "a refused resume wrote its run directory";
  // The shard repaired: resuming under another run.seed is refused naming both seeds.
  f.open(shard, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(200);
  f.put(byte);
  f.close();
  resume.argv.push_back("run.seed=4");
  r = launch::run_processes({resume}, 60)[0];
  EXPECT_EQ(r.exit_code, 2) << r.describe();
  EXPECT_NE(r.output.find("was saved by a run with run.seed 3; run.seed 4 would continue it with "
                          "another data order"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir / "second"));
  resume.argv.back() = "run.seed=3";
  r = launch::run_processes({resume}, 60)[0];
  EXPECT_EQ(r.exit_code, 0) << r.describe();
}

}  // namespace
}  // namespace loom
