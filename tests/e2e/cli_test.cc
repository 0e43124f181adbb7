// The `loom` binary as a user meets it: a real run, and every bad input ending in exit code 2
// with one message naming the key (and its line), and nothing written.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "launch/spawn.h"

namespace {

namespace fs = std::filesystem;

struct Outcome {
  int code;
  std::string output;
};

Outcome run_command(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  int status = pclose(pipe);
  return Outcome{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

Outcome run(const std::string& args) {
  return run_command(std::string(LOOM_BINARY_DIR) + "/bin/loom " + args);
}

class Cli : public testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::path(testing::TempDir()) /
        ("loom_cli_" + std::string(testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  std::string write(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  std::string base_config() {
    return "run:\n  steps: 12\n  output_dir: " + (dir_ / "run").string() +
           "\nmodel:\n  type: gpt\n  preset: tiny\nbatch:\n  global: 8\n  micro: 4\n"
           "optimizer:\n  lr: 0.003\nlogging:\n  every: 4\n";
  }
  // A bad input: exit code 2, the message contains `expect`, no crash text, nothing written.
  void expect_rejected(const std::string& args, const std::string& expect) {
    Outcome r = run(args);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(expect), std::string::npos) << "missing '" << expect << "' in:\n"
                                                        << r.output;
    for (const char* crash : {"terminate called", "Segmentation", "internal error", "Aborted"})
      EXPECT_EQ(r.output.find(crash), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir_ / "run")) << "run directory written for a bad input";
  }
  fs::path dir_;
};

TEST_F(Cli, TrainWritesConfigAndMetricsAndTheLossFalls) {
  std::string config = write("c.yaml", base_config());
  Outcome r = run("train " + config + " run.steps=30");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("step 4/30 loss"), std::string::npos) << r.output;
  ASSERT_TRUE(fs::exists(dir_ / "run" / "config.yaml"));
  std::ifstream resolved(dir_ / "run" / "config.yaml");
  std::stringstream text;
  text << resolved.rdbuf();
  EXPECT_NE(text.str().find("steps: 30"), std::string::npos) << text.str();
  std::ifstream metrics(dir_ / "run" / "metrics.jsonl");
  std::string line;
  std::vector<nlohmann::json> rows;
  while (std::getline(metrics, line)) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 30u);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i]["step"].get<int>(), static_cast<int>(i + 1));
    for (const char* key : {"loss", "step_time_s", "tokens_per_s", "lr", "grad_norm"})
      EXPECT_TRUE(rows[i].contains(key)) << key;
  }
  EXPECT_LT(rows.back()["loss"].get<double>(), rows.front()["loss"].get<double>() - 0.5);
}

TEST_F(Cli, MalformedYaml) {
  expect_rejected("train " + write("c.yaml", "run:\n  steps: [1, 2\nmodel: {}\n"), "c.yaml:");
  expect_rejected("train " + write("d.yaml", "run:\n  steps: [1, 2\nmodel: {}\n"),
                  "malformed YAML");
}

// An empty file (0 bytes, only comments, a bare `~`) is refused naming it, not trained on defaults.
TEST_F(Cli, EmptyConfigIsRefused) {
  for (const char* text : {"", "# nothing here yet\n\n# still nothing\n", "~\n"}) {
    const std::string path = write("empty.yaml", text);
    expect_rejected("train " + path, path + ": the config is empty");
    expect_rejected("plan " + path + " --out " + (dir_ / "run").string(), "the config is empty");
  }
}

// A directory given as the config is named as one (it used to read as an empty config), and a
// run directory points at the config.yaml it holds.
TEST_F(Cli, ADirectoryIsNotAConfigFile) {
  const fs::path folder = dir_ / "configs";
  fs::create_directories(folder);
  for (const char* command : {"train ", "config ", "calibrate --quick "})
    expect_rejected(command + folder.string(),
                    folder.string() + ": is a directory, not a config file; give the YAML");
  expect_rejected("plan " + folder.string() + " --out " + (dir_ / "run").string(),
                  "is a directory, not a config file");
  write("configs/config.yaml", base_config());
  expect_rejected("train " + folder.string(), "is a directory, not a config file (did you mean '" +
                                                  (folder / "config.yaml").string() + "'?)");
  Outcome r = run("config " + folder.string());
  EXPECT_EQ(r.output.find("empty"), std::string::npos) << r.output;
}

TEST_F(Cli, UnknownKeySuggestsTheClosest) {
  expect_rejected("train " + write("c.yaml", base_config() + "parallel:\n  tpp: 2\n"),
                  "c.yaml:15: unknown key 'parallel.tpp' (did you mean 'parallel.tp'?)");
}

TEST_F(Cli, WrongType) {
  expect_rejected("train " + write("c.yaml", base_config()) + " run.steps=ten",
                  "run.steps: expected an integer, got 'ten'");
}

TEST_F(Cli, NegativeOrZeroSize) {
  std::string c = write("c.yaml", base_config());
  expect_rejected("train " + c + " batch.micro=-4", "batch.micro: must be positive, got -4");
  expect_rejected("train " + c + " model.args.hidden=0",
                  "model.args.hidden: hidden must be positive");
}

TEST_F(Cli, HiddenNotDivisibleByHeads) {
  std::string cfg = "run:\n  output_dir: " + (dir_ / "run").string() +
                    "\nmodel:\n  type: gpt\n  args:\n    hidden: 64\n    heads: 5\n";
  expect_rejected("train " + write("h.yaml", cfg),
                  "h.yaml:7: model.args.heads: hidden (64) is not divisible by heads (5)");
}

TEST_F(Cli, MissingTokenFile) {
  expect_rejected("train " + write("c.yaml", base_config() + "data:\n  type: tokens\n  path: " +
                                                 (dir_ / "nope.bin").string() + "\n"),
                  "data.path: cannot read token file");
}

// comm.backend mpi under loomrun (which starts one-rank MPI worlds) says to use mpirun, not that
// too few processes were started; a plan made for another run.precision says so.
TEST_F(Cli, MpiUnderLoomrunAndAPlanOfAnotherPrecisionSayWhat) {
  const std::string c = write("c.yaml", base_config());
  Outcome r =
      run_command(std::string(LOOM_BINARY_DIR) + "/bin/loomrun --nproc-per-node 2 --standalone " +
                  LOOM_BINARY_DIR + "/bin/loom train " + c +
                  " parallel.dp=2 comm.backend=mpi comm.timeout_s=30");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("comm.backend mpi takes its 2 ranks from mpirun"), std::string::npos)
      << r.output;
  const std::string plan_dir = (dir_ / "plan").string();
  ASSERT_EQ(run("plan " + c + " --out " + plan_dir).code, 0);
  fs::remove_all(dir_ / "run");
  expect_rejected("train " + c + " run.precision=bf16 --plan " + plan_dir + "/plan.json",
                  "run.precision was fp32 in the plan, is bf16 now");
}

// A mixture of experts over gloo processes (4 ranks: ep 2 within dp 2, tp 2; the ragged
// all-to-all between processes) trains to one process's losses on the same micro-batches. fp32:
// the plans differ only in summation order (~1e-6 of the loss); a token routed or returned wrong
// moves it by 1e-3 or more.
TEST_F(Cli, MixtureOfExpertsOverGlooEqualsOneProcess) {
  const std::string c = std::string(LOOM_SOURCE_DIR) + "/configs/moe-tiny.yaml";
  const std::string common = " run.steps=3 optimizer.type=sgd optimizer.lr=0.1 comm.timeout_s=60";
  Outcome ep =
      run_command(std::string(LOOM_BINARY_DIR) + "/bin/loomrun --nproc-per-node 4 --standalone " +
                  LOOM_BINARY_DIR + "/bin/loom train " + c + common +
                  " run.output_dir=" + (dir_ / "ep").string());
  ASSERT_EQ(ep.code, 0) << ep.output;
  Outcome one = run("train " + c + common + " parallel.dp=1 parallel.ep=1 parallel.tp=1 " +
                    "batch.micro=4 run.output_dir=" + (dir_ / "one").string());
  ASSERT_EQ(one.code, 0) << one.output;
  auto losses = [](const fs::path& metrics) {
    std::ifstream in(metrics);
    std::vector<double> out;
    for (std::string line; std::getline(in, line);)
      out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    return out;
  };
  const std::vector<double> a = losses(dir_ / "ep" / "metrics.jsonl"),
                            b = losses(dir_ / "one" / "metrics.jsonl");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * b[i]) << "step " << i + 1;
  EXPECT_NE(a.front(), a.back());  // it trains
}

// A model too large for the machine is refused from the plan's estimate before anything is
// allocated, naming the key that sized it (not a LibTorch allocation failure and its trace).
TEST_F(Cli, AModelTooLargeForTheMachineIsRefusedBeforeAllocating) {
  const std::string c = write("c.yaml", base_config());
  // Refused by its numbers before anything is built (plan/size_check.h), naming the arg.
  expect_rejected("train " + c + " model.args.hidden=1048576",
                  "model.args.hidden: the model (layers 2, hidden 1048576, ffn_hidden 4194304, "
                  "vocab 256) has 2.64e+13 parameters at least");
  expect_rejected("train " + c + " model.args.vocab=2000000000",
                  "model.args.vocab: the model (layers 2, hidden 64, ffn_hidden 256, vocab "
                  "2000000000) has 1.28e+11 parameters at least");
}

// run.device=cuda where no GPU is usable (none visible, or a CPU-only build): one line naming
// the key, exit 2, nothing written. Unknown devices and precisions are refused the same way.
TEST_F(Cli, CudaWithoutAUsableGpu) {
  // An empty CUDA_VISIBLE_DEVICES hides every GPU, so a GPU machine refuses too.
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  std::string c = write("c.yaml", base_config());
  expect_rejected("train " + c + " run.device=cuda", "run.device: cuda asked for, but this");
  Outcome r = run("train " + c + " run.device=cuda");
  unsetenv("CUDA_VISIBLE_DEVICES");
  size_t lines = 0;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) lines += !line.empty();
  EXPECT_EQ(lines, 1u) << r.output;
  expect_rejected("train " + c + " run.device=tpu", "run.device");
  expect_rejected("train " + c + " run.precision=fp16", "run.precision");
}

TEST_F(Cli, MissingConfigAndBadFlags) {
  expect_rejected("train " + (dir_ / "absent.yaml").string(), "cannot read config file");
  expect_rejected("train", "config is required");
  expect_rejected("train " + write("c.yaml", base_config()) + " --bogus", "bogus");
  expect_rejected("trian", "unknown command 'trian'");
}

// A one-step checkpoint of GPT tiny (the run outside dir_/run, which expect_rejected watches).
fs::path save_checkpoint(const fs::path& dir, const std::string& config) {
  Outcome r = run("train " + config +
                  " run.steps=1 checkpoint.every=1 run.output_dir=" + (dir / "saved").string());
  EXPECT_EQ(r.code, 0) << r.output;
  return dir / "saved" / "checkpoints" / "step_00000001";
}

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// `loom checkpoint merge` refuses an OUT that is one of the checkpoint's own files (a shard, its
// manifest, the merged file it reads) before writing anything: the checkpoint stays loadable.
TEST_F(Cli, CheckpointMergeNeverWritesOverItsInput) {
  const fs::path ckpt = save_checkpoint(dir_, write("c.yaml", base_config()));
  const fs::path shard = ckpt / "rank_00000.safetensors";
  const std::string before = file_bytes(shard);
  for (const fs::path& in : {ckpt, ckpt.parent_path()}) {  // a step_N directory, or the root
    expect_rejected("checkpoint merge " + in.string() + " " + shard.string(),
                    "OUT '" + shard.string() + "' is the checkpoint's own file");
    expect_rejected("checkpoint merge " + in.string() + " " + (ckpt / "manifest.json").string(),
                    "merging over it would destroy the checkpoint");
  }
  EXPECT_EQ(file_bytes(shard), before);
  EXPECT_FALSE(fs::exists(shard.string() + ".tmp"));
  Outcome inspect = run("checkpoint inspect " + ckpt.string());
  EXPECT_EQ(inspect.code, 0) << inspect.output;

  const fs::path merged = dir_ / "merged.safetensors";
  Outcome ok = run("checkpoint merge " + ckpt.string() + " " + merged.string());
  ASSERT_EQ(ok.code, 0) << ok.output;
  const std::string merged_bytes = file_bytes(merged);
  expect_rejected("checkpoint merge " + merged.string() + " " + merged.string(),
                  "OUT '" + merged.string() + "' is the checkpoint's own file");
  EXPECT_EQ(file_bytes(merged), merged_bytes);
  expect_rejected("checkpoint merge " + ckpt.string() + " " + dir_.string(), "is a directory");
  // A rank's manifest is no file the reader lists, but it is the checkpoint's all the same.
  const std::string manifest = file_bytes(ckpt / "rank_00000.json");
  ASSERT_FALSE(manifest.empty());
  expect_rejected("checkpoint merge " + ckpt.string() + " " + (ckpt / "rank_00000.json").string(),
                  "is inside the checkpoint");
  EXPECT_EQ(file_bytes(ckpt / "rank_00000.json"), manifest);
  expect_rejected("checkpoint merge " + ckpt.string() + " ''", "OUT is empty");
  expect_rejected("checkpoint export-hf " + ckpt.string() + " ''", "OUT is empty");
  // Inspecting and exporting a merged file name the file, not its folder.
  Outcome listed = run("checkpoint inspect " + merged.string());
  EXPECT_EQ(listed.code, 0) << listed.output;
  EXPECT_EQ(listed.output.rfind("checkpoint " + merged.string() + "\n", 0), 0u) << listed.output;
  expect_rejected("checkpoint merge " + ckpt.string() + " " + (dir_ / "no" / "m.st").string(),
                  "its folder '" + (dir_ / "no").string() + "' does not exist");
}

// `loom checkpoint inspect` lists only what it has checked: a shard with a flipped data byte or a
// damaged header is exit 2 naming the file and the CRC-32 mismatch, with no listing printed.
TEST_F(Cli, CheckpointInspectVerifiesEveryShard) {
  const fs::path ckpt = save_checkpoint(dir_, write("c.yaml", base_config()));
  Outcome good = run("checkpoint inspect " + ckpt.string());
  ASSERT_EQ(good.code, 0) << good.output;
  const fs::path shard = ckpt / "rank_00000.safetensors";
  const std::string bytes = file_bytes(shard);
  for (size_t at : {bytes.size() - 3, size_t{12}}) {  // a parameter's bytes, then the header
    std::string damaged = bytes;
    damaged[at] ^= 0x20;
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << damaged;
    expect_rejected("checkpoint inspect " + ckpt.string(),
                    "checkpoint shard '" + shard.string() + "' is corrupted: CRC-32");
    Outcome r = run("checkpoint inspect " + ckpt.parent_path().string());
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_EQ(r.output.find("tensors:"), std::string::npos) << r.output;
  }
}

TEST_F(Cli, TwoRanksOfLoomTrainWriteOneRunDirectory) {
  std::string config = write(
      "c.yaml", base_config() + "parallel:\n  tp: 2\ncomm:\n  backend: gloo\n  timeout_s: 60\n");
  std::string cmd;
  int port = loom::launch::free_port();
  for (int r = 0; r < 2; ++r)
    cmd += "RANK=" + std::to_string(r) +
           " WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 LOOM_RDZV_TOKEN=cli-test MASTER_ADDR=127.0.0.1 "
           "MASTER_PORT=" +
           std::to_string(port) + " " + std::string(LOOM_BINARY_DIR) + "/bin/loom train " + config +
           " > " + (dir_ / ("rank" + std::to_string(r) + ".log")).string() + " 2>&1 & ";
  ASSERT_EQ(std::system(("timeout 120 bash -c '" + cmd + "wait'").c_str()), 0);
  std::ifstream metrics(dir_ / "run" / "metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) ++lines;
  EXPECT_EQ(lines, 12);
  std::ifstream rank1(dir_ / "rank1.log");
  std::stringstream quiet;
  quiet << rank1.rdbuf();
  EXPECT_EQ(quiet.str().find("step"), std::string::npos)
      << "rank 1 reported progress: " << quiet.str();
}

// Two ranks of one job started with different overrides stop at start, each with exit 2 and
// the same message naming the first key that differs, both values and the rank.
TEST_F(Cli, RanksStartedWithDifferentConfigsStopNamingTheKey) {
  std::string config = write(
      "c.yaml", base_config() + "parallel:\n  dp: 2\ncomm:\n  backend: gloo\n  timeout_s: 60\n");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"model.args.layers=2", "model.args.layers=3"},
       "rank 1 was started with another config than rank 0: model.args.layers is 2 on rank 0 "
       "and 3 on rank 1"},
      {{"optimizer.lr=0.003", "optimizer.lr=0.004"},
       "optimizer.lr is 0.0030000000000000001 on rank 0 and 0.0040000000000000001 on rank 1"}};
  for (const auto& [overrides, expect] : cases) {
    std::string cmd;
    const int port = loom::launch::free_port();
    for (int r = 0; r < 2; ++r)
      cmd += "(RANK=" + std::to_string(r) +
             " WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 LOOM_RDZV_TOKEN=cli-test MASTER_ADDR=127.0.0.1 "
             "MASTER_PORT=" +
             std::to_string(port) + " " + std::string(LOOM_BINARY_DIR) + "/bin/loom train " +
             config + " " + overrides[static_cast<size_t>(r)] + " > " +
             (dir_ / ("rank" + std::to_string(r) + ".log")).string() + " 2>&1; echo $? > " +
             (dir_ / ("rank" + std::to_string(r) + ".code")).string() + ") & ";
    ASSERT_EQ(std::system(("timeout 120 bash -c '" + cmd + "wait'").c_str()), 0);
    for (int r = 0; r < 2; ++r) {
      auto slurp = [&](const std::string& name) {
        std::ifstream in(dir_ / name);
        std::stringstream text;
        text << in.rdbuf();
        return text.str();
      };
      const std::string log = slurp("rank" + std::to_string(r) + ".log");
      EXPECT_EQ(slurp("rank" + std::to_string(r) + ".code"), "2\n") << log;
      EXPECT_NE(log.find(expect), std::string::npos) << log;
      EXPECT_NE(log.find("(rank 1 of 2 differs from rank 0)"), std::string::npos) << log;
    }
    EXPECT_FALSE(fs::exists(dir_ / "run" / "metrics.jsonl"));
  }
}

TEST_F(Cli, PlanWritesProgramsScheduleAndSummary) {
  std::string config = write("c.yaml", base_config());
  Outcome r =
      run("plan " + config + " parallel.tp=2 parallel.pp=2 --out " + (dir_ / "plan").string());
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* f : {"programs/rank_0.txt", "programs/rank_3.txt", "schedule.csv",
                        "timeline.json", "schedule.svg", "summary.txt"})
    EXPECT_TRUE(fs::exists(dir_ / "plan" / f)) << f;
  EXPECT_NE(r.output.find("on 4 ranks (dp 1 x tp 2 x pp 2)"), std::string::npos) << r.output;
  std::ifstream program(dir_ / "plan" / "programs" / "rank_2.txt");
  std::stringstream text;
  text << program.rdbuf();
  EXPECT_NE(text.str().find("order: F1.0 B1.0 F1.1 B1.1"), std::string::npos)
      << text.str();  // 1F1B, last stage
  expect_rejected(
      "plan " + config + " parallel.tp=2 --world-size 4 --out " + (dir_ / "run").string(),
      "= 2, but the world size is 4");
}

// Asks that used to be ignored are refused with exit 2 naming the key or flag; nothing is written.
TEST_F(Cli, AsksThatCannotBeHonouredAreRefused) {
  const std::string config = write("c.yaml", base_config());
  const std::string moe =
      " model.args.moe.experts=4 model.args.moe.first_dense=2 parallel.dp=2 parallel.ep=2";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"config " + config + " model.args.nonsense=3", "nonsense"},
      {"config " + config + " model.args.layers=abc", "model.args.layers"},
      {"config " + config + " model.preset=huge", "unknown GPT preset 'huge'"},
      {"config " + config + moe, "moe.first_dense (2) leaves none of the 2 layers with experts"},
      {"train " + config + " logging.trace_steps=[13]",
       "logging.trace_steps: step 13 is beyond the run (run.steps 12)"},
      {"plan " + config + " --world-size 0 --out " + (dir_ / "run").string(),
       "--world-size must be positive, got 0"},
      {"calibrate --timeout 0 --out " + (dir_ / "run").string(), "--timeout: expected seconds > 0"},
      {"train " + config + " --plan " + dir_.string(), "is a directory, not a plan file"},
      {"checkpoint frob", "unknown sub-command 'frob' (expected inspect, merge or export-hf)"},
      {"plan " + config + " parallel.policy=auto --world-size 7 --out " + (dir_ / "run").string(),
       "auto found no way to split this model over 7 ranks"},
  };
  for (const auto& [args, expect] : cases) expect_rejected(args, expect);
  Outcome abc =
      run_command("WORLD_SIZE=abc " + std::string(LOOM_BINARY_DIR) + "/bin/loom train " + config);
  EXPECT_EQ(abc.code, 2) << abc.output;
  EXPECT_NE(abc.output.find("WORLD_SIZE=abc is not valid"), std::string::npos) << abc.output;
  EXPECT_FALSE(fs::exists(dir_ / "run"));
}

// A checkpoint folder that cannot be written stops the run before its first step, not at the
// first checkpoint; --version names loom, LibTorch, CUDA and NCCL.
TEST_F(Cli, AnUnwritableCheckpointDirIsRefusedAtStartAndVersionSaysWhatRuns) {
  const std::string config = write("c.yaml", base_config());
  expect_rejected("train " + config + " checkpoint.every=4 checkpoint.dir=/proc/loom/ckpt",
                  "checkpoint.dir: cannot write checkpoints to '/proc/loom/ckpt'");
  const fs::path blocker = write("a-file", "x");
  expect_rejected(
      "train " + config + " checkpoint.every=4 checkpoint.dir=" + (blocker / "ckpt").string(),
      "checkpoint.dir: cannot write checkpoints to");
  Outcome v = run("--version");
  EXPECT_EQ(v.code, 0) << v.output;
  for (const char* line : {"loom 0.", "\nbuild id: ", "\nlibtorch: 2.", "\ncuda: ", "\nnccl: "})
    EXPECT_NE(v.output.find(line), std::string::npos) << line << " in\n" << v.output;
}

TEST_F(Cli, PlanJsonRunsAndAStaleOrDamagedOneIsRefused) {
  std::string config = write("c.yaml", base_config());
  const std::string plan = (dir_ / "plan" / "plan.json").string();
  Outcome made = run("plan " + config + " --out " + (dir_ / "plan").string());
  ASSERT_EQ(made.code, 0) << made.output;
  ASSERT_TRUE(fs::exists(plan));
  // Keys a plan does not depend on may change; the run uses the plan as written.
  Outcome ok = run("train " + config + " run.steps=2 optimizer.lr=0.01 --plan " + plan);
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_TRUE(fs::exists(dir_ / "run" / "metrics.jsonl"));
  fs::remove_all(dir_ / "run");

  expect_rejected("train " + config + " batch.micro=2 --plan " + plan,
                  plan + ": stale plan: batch.micro was 4 in the plan, is 2 now");
  expect_rejected("train " + config + " --plan " + (dir_ / "missing.json").string(),
                  "cannot read plan file");
  std::ifstream in(plan);
  std::stringstream text;
  text << in.rdbuf();
  // plan.json is sealed: an edit anywhere (the hash, a tensor's shape, the config text) is
  // refused naming the file, before the run uses any of it.
  const std::string edited = ": plan was edited after `loom plan` wrote it";
  std::string damaged = text.str();
  damaged.replace(damaged.find("\"hash\":\""), 8, "\"hash\":\"f");
  const std::string hash_path = write("edited.json", damaged);
  expect_rejected("train " + config + " --plan " + hash_path, hash_path + edited);
  std::string shape = text.str();
  const size_t dim = shape.find("\"shape\":[\"") + 10;
  shape[dim] = shape[dim] == '9' ? '8' : '9';
  const std::string shape_path = write("shape.json", shape);
  expect_rejected("train " + config + " --plan " + shape_path, shape_path + edited);
  std::string yaml = text.str();
  const size_t letter = yaml.find("\"config_yaml\":\"") + 15;
  yaml[letter] = yaml[letter] == 'x' ? 'y' : 'x';
  const std::string yaml_path = write("yaml.json", yaml);
  expect_rejected("train " + config + " --plan " + yaml_path, yaml_path + edited);
  expect_rejected("train " + config + " --plan " + write("cut.json", text.str().substr(0, 500)),
                  "cut.json: not a loom plan");
}

// Every parallel-config rejection, through the binary: exit code 2 and the numbers named.
TEST_F(Cli, ParallelConfigRejections) {
  const std::string config = write("c.yaml", base_config());
  const std::string plan = "plan " + config + " --out " + (dir_ / "run").string() + " ";
  // dp x tp x pp must be the world size.
  expect_rejected(
      plan + "parallel.tp=2 parallel.pp=2 --world-size 8",
      "parallel.dp (1) x parallel.tp (2) x parallel.pp (2) = 4, but the world size is 8");
  // batch.global must split into micro-batches of batch.micro on each of the dp replicas.
  expect_rejected(plan + "batch.global=10",
                  "batch.global (10) must be divisible by batch.micro (4) x parallel.dp (1)");
  expect_rejected(plan + "parallel.dp=4",
                  "batch.global (8) must be divisible by batch.micro (4) x parallel.dp (4)");
  // The interleaved schedule needs the micro-batches to be a multiple of the pipeline depth.
  expect_rejected(
      plan +
          "model.args.layers=4 parallel.pp=2 parallel.chunks=2 parallel.schedule=interleaved "
          "batch.global=12",
      "(m: the micro-batches per step, batch.global 12 / (batch.micro 4 x parallel.dp 1) = 3; p: "
      "parallel.pp 2)");
  // Tensor parallelism must divide the heads (and with them the hidden size), the MLP width and
  // the vocabulary groups.
  expect_rejected(plan + "parallel.tp=8",
                  "tensor parallelism 8 needs model.preset (tiny) heads (4) to be divisible by 8");
  expect_rejected(plan + "parallel.tp=2 model.args.ffn_hidden=130 parallel.tp=4",
                  "model.args.ffn_hidden (130) to be divisible by 4");
  expect_rejected(plan + "parallel.tp=2 model.args.vocab_groups=1",
                  "tensor parallelism 2 needs model.args.vocab_groups (1) to be divisible by 2");
  // A vocabulary tp cannot split is padded by itself (to 256, whose 64 groups tp 2 splits).
  const Outcome padded = run("plan " + config + " --out " + (dir_ / "padded").string() +
                             " parallel.tp=2 model.args.vocab=255");
  EXPECT_EQ(padded.code, 0) << padded.output;
  // The same checks guard loom train before anything is written.
  expect_rejected("train " + config + " parallel.tp=3", "heads (4) to be divisible by 3");
}

// `loom plan` output for GPT tiny plans against golden files (tests/e2e/golden/plan-NAME/):
// the summary, the schedule and every rank's program. LOOM_UPDATE_GOLDEN=1 rewrites them.
void expect_plan_golden(Outcome (*run_loom)(const std::string&), const fs::path& dir,
                        const std::string& name, const std::string& overrides, int world) {
  const fs::path out = dir / ("plan-" + name);
  Outcome r = run_loom("plan " + std::string(LOOM_SOURCE_DIR) + "/configs/gpt-tiny.yaml " +
                       overrides + " --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const fs::path golden = fs::path(LOOM_SOURCE_DIR) / "tests" / "e2e" / "golden" / ("plan-" + name);
  std::vector<std::string> files = {"summary.txt"};
  if (fs::exists(out / "schedule.csv")) files.push_back("schedule.csv");
  for (int k = 0; k < world; ++k) files.push_back("programs/rank_" + std::to_string(k) + ".txt");
  const bool update = std::getenv("LOOM_UPDATE_GOLDEN") != nullptr;
  for (const auto& f : files) {
    std::ifstream got_in(out / f);
    std::stringstream got;
    got << got_in.rdbuf();
    if (update) {
      fs::create_directories((golden / f).parent_path());
      std::ofstream(golden / f) << got.str();
      continue;
    }
    std::ifstream want_in(golden / f);
    ASSERT_TRUE(want_in) << "missing golden file " << (golden / f)
                         << " (run with LOOM_UPDATE_GOLDEN=1)";
    std::stringstream want;
    want << want_in.rdbuf();
    EXPECT_EQ(got.str(), want.str()) << name << ": " << f << " differs from its golden file";
  }
  // The summary is also what the command printed.
  std::ifstream summary(out / "summary.txt");
  std::stringstream text;
  text << summary.rdbuf();
  EXPECT_NE(r.output.find(text.str()), std::string::npos) << r.output;
}

TEST_F(Cli, PlanGoldenTp2Pp2) {
  expect_plan_golden(run, dir_, "tp2-pp2", "parallel.tp=2 parallel.pp=2", 4);
}
TEST_F(Cli, PlanGoldenDp2) { expect_plan_golden(run, dir_, "dp2", "parallel.dp=2", 2); }
TEST_F(Cli, PlanGoldenTp2Sp) {
  expect_plan_golden(run, dir_, "tp2-sp", "parallel.tp=2 parallel.sp=true", 2);
}

TEST_F(Cli, PlanTimelineHasACommunicationTrack) {
  Outcome r = run("plan " + write("c.yaml", base_config()) + " parallel.tp=2 parallel.pp=2 --out " +
                  (dir_ / "plan").string());
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(dir_ / "plan" / "timeline.json");
  nlohmann::json trace = nlohmann::json::parse(in);
  int comm = 0, blocks = 0;
  for (const auto& e : trace["traceEvents"]) {
    const std::string cat = e.value("cat", "");
    if (cat == "comm") {
      ++comm;
      EXPECT_EQ(e["tid"], 1);
      EXPECT_GT(e["dur"].get<double>(), 0);
    }
    blocks += cat == "F" || cat == "B";
  }
  EXPECT_EQ(blocks, 2 * 2 * 2);  // 2 stages x 2 micro-batches x (F, B)
  EXPECT_EQ(comm, blocks);       // tensor parallelism communicates in every block
  EXPECT_NE(r.output.find("est. step time"), std::string::npos) << r.output;
}

// parallel.schedule search: `loom plan` dumps the schedule the search found on the plan's
// stage costs (tests/plan checks it is search_schedule's), not 1F1B's.
TEST_F(Cli, PlanDumpsTheSearchedSchedule) {
  const std::string base = "plan " + write("c.yaml", base_config()) +
                           " parallel.pp=4 model.args.layers=6 batch.global=8 batch.micro=1 ";
  Outcome searched = run(base + "parallel.schedule=search --out " + (dir_ / "search").string());
  ASSERT_EQ(searched.code, 0) << searched.output;
  EXPECT_NE(searched.output.find("schedule search"), std::string::npos) << searched.output;
  Outcome rule = run(base + "parallel.schedule=1f1b --out " + (dir_ / "1f1b").string());
  ASSERT_EQ(rule.code, 0) << rule.output;
  auto read = [](const fs::path& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  const std::string csv = read(dir_ / "search" / "schedule.csv");
  EXPECT_FALSE(csv.empty());
  EXPECT_NE(csv, read(dir_ / "1f1b" / "schedule.csv"));
  nlohmann::json trace = nlohmann::json::parse(read(dir_ / "search" / "timeline.json"));
  int blocks = 0;
  for (const auto& e : trace["traceEvents"])
    blocks += e.value("cat", "") == "F" || e.value("cat", "") == "B";
  EXPECT_EQ(blocks, 4 * 8 * 2);  // 4 stages x 8 micro-batches x (F, B)
}

// --top 0 used to be CLI11's range check, printing the largest double in 309 digits.
TEST_F(Cli, PlanTopMustBeAtLeastOne) {
  const std::string config = write("c.yaml", base_config());
  for (const char* top : {"0", "-2"}) {
    const std::string args = "plan " + config + " parallel.policy=auto --world-size 4 --top " +
                             top + " --out " + (dir_ / "run").string();
    expect_rejected(args, std::string("--top must be at least 1 (the plans to list, the chosen one "
                                      "first), got ") +
                              top);
    EXPECT_LT(run(args).output.size(), 200u);
  }
}

// A schedule that would not fit in memory is refused naming the options, not a bad_alloc.
TEST_F(Cli, ScheduleTooLargeForMemoryIsRefused) {
  expect_rejected("schedule --kind 1f1b --stages 100000 --micro-batches 100000",
                  "--stages 100000 x --micro-batches 100000 = 10000000000 (stage, micro-batch) "
                  "pairs would take about 9.3 TiB of memory");
  expect_rejected("schedule --kind interleaved --stages 50000 --chunks 4 --micro-batches 100000",
                  "--stages 50000 x --chunks 4 x --micro-batches 100000 = 20000000000");
  expect_rejected("schedule --kind search --stages 100000 --micro-batches 100000",
                  "more than this machine's");
  expect_rejected("schedule --kind search --placement " + std::string(LOOM_SOURCE_DIR) +
                      "/configs/placements/k_shape.yaml --micro-batches 2000000000",
                  "k_shape.yaml's 3 stages per micro-batch (6 forward and backward blocks) x "
                  "--micro-batches 2000000000 = 6000000000 (stage, micro-batch) pairs");
  Outcome ok = run("schedule --kind 1f1b --stages 8 --micro-batches 64");
  EXPECT_EQ(ok.code, 0) << ok.output;
}

TEST_F(Cli, MultiRankPlanInASingleProcessIsRefused) {
  expect_rejected("train " + write("c.yaml", base_config()) + " parallel.tp=2",
                  "parallel.dp (1) x parallel.tp (2) x parallel.pp (1) = 2 ranks, but 1 processes "
                  "were started");
}

// `loom schedule --from-csv`: a schedule exported with --csv reads back to the same simulation,
// printed and drawn the same ways; split backward cells simulate too.
TEST_F(Cli, ScheduleFromCsvSimulatesWhatScheduleCsvExported) {
  const std::string csv = (dir_ / "i.csv").string();
  Outcome out = run(
      "schedule --kind interleaved --stages 2 --chunks 2 --micro-batches 4 --json --csv " + csv);
  ASSERT_EQ(out.code, 0) << out.output;
  const fs::path svg = dir_ / "s.svg", trace = dir_ / "t.json";
  Outcome in = run("schedule --from-csv " + csv + " --json --svg " + svg.string() + " --trace " +
                   trace.string());
  ASSERT_EQ(in.code, 0) << in.output;
  const nlohmann::json a = nlohmann::json::parse(out.output), b = nlohmann::json::parse(in.output);
  EXPECT_EQ(b["kind"], "csv");
  EXPECT_EQ(b["devices"], 2);
  EXPECT_EQ(b["micro_batches"], 4);
  for (const char* key : {"makespan", "bubble_ratio", "peak_memory"}) EXPECT_EQ(b[key], a[key]);
  EXPECT_TRUE(fs::exists(svg));
  std::ifstream t(trace);
  EXPECT_FALSE(nlohmann::json::parse(t)["traceEvents"].empty());

  const std::string zb = (dir_ / "zb.csv").string();
  ASSERT_EQ(run("schedule --kind zb-h1 --stages 2 --micro-batches 2 --csv " + zb).code, 0);
  Outcome split = run("schedule --from-csv " + zb + " --wgrad 0.5");
  ASSERT_EQ(split.code, 0) << split.output;
  EXPECT_NE(split.output.find("schedule       csv (2 devices, 2 micro-batches)"), std::string::npos)
      << split.output;
}

TEST_F(Cli, ScheduleFromCsvRefusesABadFileNamingTheCell) {
  expect_rejected("schedule --from-csv " + write("m.csv", "0F0,0X1\n"),
                  "m.csv: row 1, column 2: '0X1' is not a block");
  expect_rejected("schedule --from-csv " + write("g.csv", "0F0,0F1,0B0\n,1F0,1B0,1F1,1B1\n"),
                  "g.csv: block 0B1 (stage 0, micro-batch 1, B) is missing: row 1, which runs "
                  "stage 0 for micro-batch 1, does not list it");
  expect_rejected("schedule --from-csv " + write("d.csv", "0F0,,,0B0\n,1B0,1F0,\n"),
                  "d.csv: row 2, column 2: block 1B0 waits for 1F0, which its row runs later");
  expect_rejected("schedule --from-csv " + write("l.csv", "0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n"),
                  "l.csv: the schedule deadlocks: row 1, column 2 (0B0) waits for 1B0 (row 2, "
                  "column 3); row 2, column 1 (1F1) waits for 0F1 (row 1, column 3)");
  const std::string none = (dir_ / "none.csv").string();
  expect_rejected("schedule --from-csv " + none, "cannot read schedule file '" + none + "'");
  expect_rejected("schedule --from-csv " + write("k.csv", "0F0,0B0\n") + " --kind 1f1b",
                  "--from-csv takes the stages, ranks and micro-batches from the file");
}

// parallel.schedule csv: `loom plan` runs and dumps the file's order, a split backward's (zb-h1's)
// too; `loom train` refuses a file with too few rows, naming the key and the file.
TEST_F(Cli, PlanAndTrainReadParallelScheduleCsv) {
  const std::string csv = (dir_ / "i.csv").string();
  ASSERT_EQ(
      run("schedule --kind interleaved --stages 2 --chunks 2 --micro-batches 4 --csv " + csv).code,
      0);
  const std::string config = write("c.yaml", base_config());
  const std::string keys =
      " parallel.pp=2 parallel.chunks=2 model.args.layers=4 batch.global=8 "
      "batch.micro=2 parallel.schedule=csv parallel.schedule_csv=";
  Outcome plan = run("plan " + config + keys + csv + " --out " + (dir_ / "plan").string());
  ASSERT_EQ(plan.code, 0) << plan.output;
  auto read = [](const fs::path& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  EXPECT_EQ(read(dir_ / "plan" / "schedule.csv"), read(csv));

  const std::string zb = (dir_ / "zb.csv").string();
  ASSERT_EQ(run("schedule --kind zb-h1 --stages 2 --micro-batches 4 --csv " + zb).code, 0);
  // The split backward plans (and trains: tests/runtime/distributed_test.cc) as I and W blocks.
  const std::string zb_keys =
      " parallel.pp=2 batch.micro=2 parallel.schedule=csv parallel.schedule_csv=";
  Outcome zb_plan = run("plan " + config + zb_keys + zb + " --out " + (dir_ / "zb").string());
  ASSERT_EQ(zb_plan.code, 0) << zb_plan.output;
  EXPECT_EQ(read(dir_ / "zb" / "schedule.csv"), read(zb));
  expect_rejected(
      "train " + config + zb_keys + csv + " parallel.pp=4 model.args.layers=4",
      "parallel.schedule_csv: " + csv + ": the schedule has 2 rows (ranks), parallel.pp is 4");
}

}  // namespace
