// What `loom train` writes into run.output_dir, when things go wrong: a write that fails (a full
// disk, here /dev/full behind the file's name) stops the run naming the file; a second run in a
// directory another run holds is refused naming the holder; a resumed run keeps one
// metrics.jsonl row per step; a checkpoint already at run.steps says there is nothing to train; a
// finished run is refused unless overwritten; SIGTERM checkpoints the step it ends; a diverged
// run stops with exit code 1.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "launch/spawn.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using launch::Launch;
using launch::ProcessResult;

const std::string kLoom = std::string(LOOM_BINARY_DIR) + "/bin/loom";

class RunOutput : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) /
           ("loom_output_" +
            std::string(testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(run_dir());
    config_ = dir_ / "c.yaml";
    std::ofstream(config_) << "run: {steps: 3, output_dir: " << run_dir().string() << "}\n"
                           << "model: {type: gpt, preset: tiny, args: {layers: 1}}\n"
                              "batch: {global: 4, micro: 2}\n";
  }
  fs::path run_dir() const { return dir_ / "run"; }
  // `loom train` of the config with `extra`, pinned to one thread (the machine is shared).
  Launch train(const std::vector<std::string>& extra) const {
    Launch l;
    l.argv = {kLoom, "train", config_.string()};
    l.argv.insert(l.argv.end(), extra.begin(), extra.end());
    l.env = {{"OMP_NUM_THREADS", "1"}};
    return l;
  }
  ProcessResult run(const Launch& launch) const { return launch::run_processes({launch}, 120)[0]; }
  // The steps of metrics.jsonl's rows, in file order.
  std::vector<int64_t> metrics_steps() const {
    std::ifstream in(run_dir() / "metrics.jsonl");
    std::vector<int64_t> steps;
    for (std::string line; std::getline(in, line);)
      steps.push_back(nlohmann::json::parse(line)["step"].get<int64_t>());
    return steps;
  }
  std::string read(const fs::path& file) const {
    std::ifstream in(file);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  fs::path dir_, config_;
};

// A checkpoint's directory name: step_NNNNNNNN.
std::string step_dir(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

// A user's mistake or the machine's: exit 2, `expect` in the message, no crash text.
void expect_refused(const ProcessResult& r, const std::string& expect) {
  EXPECT_EQ(r.exit_code, 2) << r.describe();
  EXPECT_NE(r.output.find(expect), std::string::npos) << "missing '" << expect << "' in:\n"
                                                      << r.output;
  for (const char* crash : {"terminate called", "Segmentation", "internal error", "Aborted"})
    EXPECT_EQ(r.output.find(crash), std::string::npos) << r.output;
}

TEST_F(RunOutput, MetricsOnAFullDiskStopTheRunNamingTheFile) {
  fs::create_symlink("/dev/full", run_dir() / "metrics.jsonl");
  const ProcessResult r = run(train({}));
  expect_refused(
      r, "cannot write '" + (run_dir() / "metrics.jsonl").string() + "': No space left on device");
  EXPECT_EQ(r.output.find("done"), std::string::npos) << r.output;

  // The same for a resumed run, which appends (and must not read the device: it never ends).
  fs::remove(run_dir() / "metrics.jsonl");
  ASSERT_TRUE(run(train({"checkpoint.every=1", "run.steps=1", "run.overwrite=true"})).ok());
  fs::remove(run_dir() / "metrics.jsonl");
  fs::create_symlink("/dev/full", run_dir() / "metrics.jsonl");
  expect_refused(run(train({"checkpoint.resume=latest"})), "No space left on device");
}

// LOOM_PROFILE_STEP's trace is a per-step output too: a file that cannot be written (a directory
// is in its place) stops the run naming it.
TEST_F(RunOutput, AProfileThatCannotBeWrittenStopsTheRunNamingTheFile) {
  const fs::path profile = run_dir() / "profile_step_2_rank_0.json";
  fs::create_directories(profile);
  Launch l = train({});
  l.env["LOOM_PROFILE_STEP"] = "2";
  expect_refused(run(l), profile.string());
  EXPECT_EQ(metrics_steps(), (std::vector<int64_t>{1})) << "the run went on past step 2";
}

// A `loom train` started in the background, SIGKILLed (with its process group) at the end.
class Background {
 public:
  explicit Background(const Launch& launch) {
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      for (const auto& [k, v] : launch.env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv;
      for (const std::string& a : launch.argv) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      freopen("/dev/null", "w", stdout);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~Background() { kill(); }
  pid_t pid() const { return pid_; }
  // Sends `signal` and waits (at most `limit_s`) for the exit: its wait status, or -1.
  int signal_and_wait(int signal, double limit_s) {
    ::kill(pid_, signal);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
    int status = 0;
    while (std::chrono::steady_clock::now() < until) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

// Waits (at most `limit_s`) until `file` exists and is not empty.
bool wait_for_content(const fs::path& file, double limit_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  std::error_code ec;
  while (std::chrono::steady_clock::now() < until) {
    if (fs::exists(file, ec) && fs::file_size(file, ec) > 0 && !ec) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// While a run trains in the directory, a second one is refused naming the directory and the
// holder's pid, and writes nothing there (its event file included). The lock ends with the
// process holding it: once the first run is killed, the directory is free at once.
TEST_F(RunOutput, ASecondRunInTheDirectoryIsRefusedWhileTheFirstHoldsIt) {
  Background first(train({"run.steps=1000000"}));
  ASSERT_TRUE(wait_for_content(run_dir() / "metrics.jsonl", 60)) << "the first run never trained";
  const std::string config_before = read(run_dir() / "config.yaml");
  const fs::path tb = dir_ / "tb";
  const ProcessResult second = run(train({"run.steps=2", "logging.tensorboard=" + tb.string()}));
  expect_refused(second, "run.output_dir: '" + run_dir().string() + "' is in use by another run");
  EXPECT_NE(second.output.find("pid " + std::to_string(first.pid())), std::string::npos)
      << second.output;
  EXPECT_EQ(read(run_dir() / "config.yaml"), config_before) << "the refused run wrote config.yaml";
  EXPECT_TRUE(!fs::exists(tb) || fs::is_empty(tb)) << "the refused run left an event file";

  first.kill();
  const ProcessResult third = run(train({"run.steps=2", "run.overwrite=true"}));
  ASSERT_TRUE(third.ok()) << third.describe();
  EXPECT_EQ(metrics_steps(), (std::vector<int64_t>{1, 2}));
}

// A run killed in step 4 resumes from its checkpoint of step 2: metrics.jsonl ends with one row
// per step, the replayed step 3's row being the resumed run's.
TEST_F(RunOutput, AResumedRunKeepsOneMetricsRowPerStep) {
  Launch killed = train({"run.steps=5", "checkpoint.every=2"});
  killed.env["LOOM_DEBUG_KILL_AT_STEP"] = "4";
  const ProcessResult k = run(killed);
  ASSERT_EQ(k.signal, SIGKILL) << k.describe();
  ASSERT_EQ(metrics_steps(), (std::vector<int64_t>{1, 2, 3}));
  // A row the kill cut short, as a write interrupted mid-row leaves it.
  std::ofstream(run_dir() / "metrics.jsonl", std::ios::app) << "{\"step\": 4, \"lo";

  const ProcessResult r = run(train({"run.steps=5", "checkpoint.resume=latest"}));
  ASSERT_TRUE(r.ok()) << r.describe();
  EXPECT_NE(r.output.find("resumed from step 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dropped 2 row(s) after step 2"), std::string::npos) << r.output;
  EXPECT_EQ(metrics_steps(), (std::vector<int64_t>{1, 2, 3, 4, 5}));
}

// Resuming a checkpoint already at run.steps trains nothing and says so, and leaves the run
// directory as it was (config.yaml still says the steps it was trained for).
TEST_F(RunOutput, ACheckpointAtOrPastRunStepsSaysThereIsNothingToTrain) {
  ASSERT_TRUE(run(train({"checkpoint.every=3"})).ok());
  const std::string config_before = read(run_dir() / "config.yaml");
  for (const char* steps : {"run.steps=3", "run.steps=2"}) {
    const ProcessResult r = run(train({steps, "checkpoint.resume=latest"}));
    ASSERT_TRUE(r.ok()) << r.describe();
    EXPECT_NE(r.output.find("nothing to train: the checkpoint " +
                            (run_dir() / "checkpoints" / "step_00000003").string() +
                            " is at step 3, already at or past " + steps),
              std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("loss 0.0000"), std::string::npos) << r.output;
    EXPECT_EQ(read(run_dir() / "config.yaml"), config_before) << steps;
    EXPECT_EQ(metrics_steps(), (std::vector<int64_t>{1, 2, 3})) << steps;
  }
}

// A fresh run refuses a directory that holds a finished run, changing nothing there; with
// run.overwrite it clears the directory whole (the old checkpoints too) and starts over.
TEST_F(RunOutput, AFinishedRunIsRefusedUnlessOverwritten) {
  ASSERT_TRUE(run(train({"checkpoint.every=3"})).ok());
  std::ofstream(run_dir() / "notes.txt") << "the old run's";
  const std::string metrics_before = read(run_dir() / "metrics.jsonl");
  const std::string config_before = read(run_dir() / "config.yaml");
  const ProcessResult r = run(train({"run.steps=2"}));
  expect_refused(r, "'" + run_dir().string() + "' holds a run");
  EXPECT_NE(r.output.find("run.overwrite"), std::string::npos) << r.output;
  EXPECT_EQ(read(run_dir() / "metrics.jsonl"), metrics_before);
  EXPECT_EQ(read(run_dir() / "config.yaml"), config_before);

  const ProcessResult over =
      run(train({"run.steps=2", "checkpoint.every=1", "run.overwrite=true"}));
  ASSERT_TRUE(over.ok()) << over.describe();
  EXPECT_EQ(metrics_steps(), (std::vector<int64_t>{1, 2}));
  EXPECT_FALSE(fs::exists(run_dir() / "notes.txt"));
  EXPECT_FALSE(fs::exists(run_dir() / "checkpoints" / "step_00000003"));
  EXPECT_TRUE(fs::exists(run_dir() / "checkpoints" / "step_00000002" / "manifest.json"));
}

// SIGTERM stops `loom train` at the next step boundary: the step's row and checkpoint are
// written (checkpoint.every does not divide it), and the exit is 128 + SIGTERM.
TEST_F(RunOutput, SigtermCheckpointsTheStepItEndsAndExits) {
  Background training(train({"run.steps=1000000", "checkpoint.every=100000"}));
  ASSERT_TRUE(wait_for_content(run_dir() / "metrics.jsonl", 60)) << "the run never trained";
  const int status = training.signal_and_wait(SIGTERM, 60);
  ASSERT_TRUE(WIFEXITED(status)) << "wait status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
  const std::vector<int64_t> steps = metrics_steps();
  ASSERT_FALSE(steps.empty());
  const fs::path last = run_dir() / "checkpoints" / step_dir(steps.back());
  EXPECT_TRUE(fs::exists(last / "manifest.json")) << last;
}

// A run that diverges (optimizer.lr 1e30) stops with exit code 1 naming the step and a
// non-finite tensor: the step whose loss is not finite (the row of the step before is the last),
// or the step whose updated state is not (its row is the last; its checkpoint is not written).
TEST_F(RunOutput, ADivergedRunStopsWithExitCode1NamingTheStep) {
  const ProcessResult r =
      run(train({"run.steps=20", "optimizer.type=sgd", "optimizer.lr=1e30",
                 "optimizer.clip_grad_norm=0", "checkpoint.every=1", "checkpoint.keep=30"}));
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  EXPECT_NE(r.output.find("non-finite"), std::string::npos) << r.output;
  const std::vector<int64_t> steps = metrics_steps();
  ASSERT_FALSE(steps.empty()) << r.output;
  ASSERT_LT(steps.back(), 20) << r.output;
  const int64_t last = steps.back();
  const bool in_step = r.output.find("step " + std::to_string(last + 1) + ":") != std::string::npos;
  const bool after_step =
      r.output.find("after step " + std::to_string(last) + " ") != std::string::npos;
  EXPECT_TRUE(in_step || after_step) << r.output;
  EXPECT_EQ(fs::exists(run_dir() / "checkpoints" / step_dir(last) / "manifest.json"), in_step);
}

}  // namespace
}  // namespace loom
