// Checkpoints in one process: resuming equals the uninterrupted run bit for bit (AdamW state,
// data position, step), and every bad checkpoint (truncated, corrupted, foreign, another model
// or optimizer, a missing shard or slice, value-partial slices only) is refused with a message
// naming the file and tensor, with nothing on disk changed. When checkpoints are saved (the last
// step, a stop signal's, after the step's record), that none holds a non-finite value (nor is
// one trained on, nor exported), and that a checkpoint directory is one run's, never written
// through a link leading out of it. checkpoint.async writes what a synchronous save writes.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

using namespace std::string_literals;

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <csignal>
#include <nlohmann/json.hpp>

#include "checkpoint/crc32.h"
#include "checkpoint/reader.h"
#include "core/durable_file.h"
#include "launch/hf_export.h"
#include "launch/planned_trainer.h"
#include "runtime/checkpoint_dir.h"
#include "runtime/executor.h"
#include "runtime/stop_signal.h"
#include "runtime/trainer.h"
#include "tests/runtime/local_ranks.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

const char* kYaml = R"(run: {seed: 5, steps: 6}
model: {type: gpt, preset: tiny}
batch: {global: 4, micro: 2}
optimizer: {type: adamw, lr: 0.01, weight_decay: 0.1, clip_grad_norm: 1.0, warmup_steps: 2, schedule: cosine}
)";

Config config(const std::vector<std::string>& overrides) {
  auto c = parse_config(kYaml, "test.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) files[e.path().string()] = *read_whole_file(e.path());
  return files;
}

class Checkpoint : public testing::Test {
 protected:
  void SetUp() override {
    root_ =
        fs::path(testing::TempDir()) /
        ("loom_ckpt_" + std::string(testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    auto t =
        launch::create_trainer(config({"checkpoint.every=3", "checkpoint.dir=" + root_.string()}));
    ASSERT_TRUE(t.ok()) << t.error().message;
    for (int i = 0; i < 6; ++i) {
      auto st = (*t)->step();
      ASSERT_TRUE(st.ok()) << st.error().message;
      losses_.push_back(st->loss);
    }
    for (const auto& tensor : (*t)->graph().tensors())
      if (tensor.role == graph::TensorRole::kParameter)
        final_[tensor.name] = (*t)->executor().parameter(tensor.name).detach().clone();
    step3_ = root_ / "step_00000003";
  }

  fs::path shard() const { return step3_ / "rank_00000.safetensors"; }
  nlohmann::json manifest() const {
    return nlohmann::json::parse(*read_whole_file(step3_ / "manifest.json"));
  }
  void write_manifest(const nlohmann::json& j) const {
    std::ofstream(step3_ / "manifest.json") << j.dump();
  }

  // Resuming from step 3 fails with a message holding every one of `expect`, changing nothing.
  void expect_refused(const std::vector<std::string>& expect,
                      std::vector<std::string> overrides = {}) {
    const auto before = snapshot(root_);
    overrides.push_back("checkpoint.resume=" + step3_.string());
    auto t = launch::create_trainer(config(overrides));
    ASSERT_FALSE(t.ok()) << "a bad checkpoint was loaded";
    for (const auto& e : expect)
      EXPECT_NE(t.error().message.find(e), std::string::npos)
          << "missing '" << e << "' in: " << t.error().message;
    EXPECT_EQ(snapshot(root_), before) << "a refused load changed the checkpoint directory";
  }

  fs::path root_, step3_;
  std::vector<double> losses_;
  std::map<std::string, at::Tensor> final_;
};

TEST_F(Checkpoint, ResumeEqualsTheUninterruptedRunExactly) {
  auto t = launch::create_trainer(config({"checkpoint.resume=" + step3_.string()}));
  ASSERT_TRUE(t.ok()) << t.error().message;
  ASSERT_EQ((*t)->steps_done(), 3);
  for (int i = 3; i < 6; ++i)
    EXPECT_EQ((*t)->step()->loss, losses_[static_cast<size_t>(i)]) << "step " << i + 1;
  for (const auto& [name, want] : final_)
    EXPECT_TRUE(at::equal((*t)->executor().parameter(name), want)) << name;
}

TEST_F(Checkpoint, LatestResumesTheNewestAndKeepPrunes) {
  auto t = launch::create_trainer(
      config({"checkpoint.resume=latest", "checkpoint.dir=" + root_.string()}));
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ((*t)->steps_done(), 6);
  auto fresh = launch::create_trainer(
      config({"checkpoint.resume=latest", "checkpoint.dir=" + (root_ / "none_yet").string()}));
  ASSERT_TRUE(fresh.ok()) << fresh.error().message;
  EXPECT_EQ((*fresh)->steps_done(), 0);
  // keep=1: only the newest survives a save.
  auto one = launch::create_trainer(
      config({"checkpoint.every=1", "checkpoint.keep=1", "checkpoint.dir=" + root_.string(),
              "checkpoint.resume=latest"}));
  ASSERT_TRUE(one.ok());
  ASSERT_TRUE((*one)->step().ok());
  EXPECT_FALSE(fs::exists(root_ / "step_00000006"));
  EXPECT_FALSE(fs::exists(step3_));
  EXPECT_TRUE(fs::exists(root_ / "step_00000007" / "manifest.json"));
}

TEST_F(Checkpoint, TruncatedShard) {
  fs::resize_file(shard(), fs::file_size(shard()) / 2);
  expect_refused({shard().string(), "truncated"});
}

TEST_F(Checkpoint, CorruptedShard) {
  std::string bytes = *read_whole_file(shard());
  bytes[bytes.size() / 2] ^= 0x40;
  std::ofstream(shard(), std::ios::binary) << bytes;
  expect_refused({shard().string(), "corrupted", "CRC-32"});
}

TEST_F(Checkpoint, ForeignManifest) {
  std::ofstream(step3_ / "manifest.json") << "PK\x03\x04 this is a zip file";
  expect_refused({(step3_ / "manifest.json").string(), "not a valid loom checkpoint manifest"});
}

TEST_F(Checkpoint, ForeignShardWithAMatchingChecksum) {
  const std::string foreign = "\x10\0\0\0\0\0\0\0{\"a\":[1,2]}     "s;
  std::ofstream(shard(), std::ios::binary | std::ios::trunc) << foreign;
  auto j = manifest();
  j["files"][0]["bytes"] = foreign.size();
  j["files"][0]["crc32"] = crc32(foreign);
  write_manifest(j);
  expect_refused({shard().string(), "not a valid safetensors file"});
}

TEST_F(Checkpoint, MissingShard) {
  fs::remove(shard());
  expect_refused({shard().string(), "missing"});
}

TEST_F(Checkpoint, AnotherModelShape) {
  expect_refused({"step_00000003", "'wte'", "shape"},
                 {"model.args.hidden=32", "model.args.heads=2"});
}

TEST_F(Checkpoint, AnotherModelTensors) {
  expect_refused({"step_00000003", "has no parameter 'h2."}, {"model.args.layers=3"});
}

TEST_F(Checkpoint, AnotherOptimizer) {
  expect_refused({"optimizer.type", "adamw", "sgd"}, {"optimizer.type=sgd"});
}

TEST_F(Checkpoint, AnotherBatchSizeWouldMoveTheDataPosition) {
  expect_refused({"batch.global", "12 samples"}, {"batch.global=8"});
}

TEST_F(Checkpoint, ASliceStoredNowhere) {
  auto j = manifest();
  nlohmann::json kept = nlohmann::json::array();
  std::string dropped;
  for (const auto& s : j["slices"]) {
    if (dropped.empty() && s["kind"] == "param") {
      dropped = s["tensor"];
      continue;
    }
    kept.push_back(s);
  }
  j["slices"] = kept;
  write_manifest(j);
  expect_refused({"step_00000003", "'" + dropped + "'"});
}

TEST_F(Checkpoint, ValuePartialSlicesAreNotValues) {
  auto j = manifest();
  std::string partial;
  for (auto& s : j["slices"])
    if (partial.empty() && s["kind"] == "param") {
      partial = s["tensor"];
      s["value_chunks"] = 2;
    }
  write_manifest(j);
  expect_refused({"'" + partial + "'", "value-partial"});
}

// The steps of the complete checkpoints under `root`.
std::vector<int64_t> saved_steps(const fs::path& root) {
  std::vector<int64_t> steps;
  for (const auto& [step, dir] : complete_checkpoints(root)) steps.push_back(step);
  return steps;
}

fs::path fresh_root(const std::string& name) {
  const fs::path d = fs::path(testing::TempDir()) / ("loom_ckpt_" + name);
  fs::remove_all(d);
  return d;
}

// run.steps=10 with checkpoint.every=4 saves 4, 8 and the last step, 10.
TEST(CheckpointWhen, TheLastStepIsAlwaysSaved) {
  const fs::path root = fresh_root("last_step");
  auto t = launch::create_trainer(config({"run.steps=10", "checkpoint.every=4", "checkpoint.keep=5",
                                          "checkpoint.dir=" + root.string()}));
  ASSERT_TRUE(t.ok()) << t.error().message;
  for (int i = 0; i < 10; ++i) {
    auto st = (*t)->step();
    ASSERT_TRUE(st.ok()) << st.error().message;
    EXPECT_EQ(st->checkpointed, i + 1 == 4 || i + 1 == 8 || i + 1 == 10) << "step " << i + 1;
  }
  EXPECT_EQ(saved_steps(root), (std::vector<int64_t>{4, 8, 10}));
}

// SIGTERM (through the handler loom train installs) ends the run after the step it reaches, that
// step's checkpoint saved although checkpoint.every does not divide it.
TEST(CheckpointWhen, AStopSignalSavesTheStepItEnds) {
  const fs::path root = fresh_root("stop_signal");
  auto t =
      launch::create_trainer(config({"checkpoint.every=5", "checkpoint.dir=" + root.string()}));
  ASSERT_TRUE(t.ok()) << t.error().message;
  auto first = (*t)->step();
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(first->stop_signal, 0);
  runtime::install_stop_handlers();
  std::raise(SIGTERM);
  auto st = (*t)->step();
  runtime::set_stop_signal(0);
  std::signal(SIGTERM, SIG_DFL);  // the rest of the binary as it was
  std::signal(SIGINT, SIG_DFL);
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_EQ(st->stop_signal, SIGTERM);
  EXPECT_TRUE(st->checkpointed);
  EXPECT_EQ(saved_steps(root), (std::vector<int64_t>{2}));
}

// The step's record (loom train's metrics row) is made before its checkpoint commits: a kill
// after the checkpoint cannot lose the row.
TEST(CheckpointWhen, TheStepRecordComesBeforeItsCheckpoint) {
  const fs::path root = fresh_root("record_first");
  auto t = launch::create_trainer(
      config({"run.steps=3", "checkpoint.every=1", "checkpoint.dir=" + root.string()}));
  ASSERT_TRUE(t.ok()) << t.error().message;
  std::vector<int64_t> recorded;
  (*t)->set_step_recorder([&](const runtime::StepStats& st) {
    EXPECT_TRUE(st.checkpointed);
    EXPECT_FALSE(fs::exists(root / checkpoint_dir_name(st.step) / kManifestName))
        << "step " << st.step << "'s checkpoint committed before its record";
    recorded.push_back(st.step);
    return Status::success();
  });
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*t)->step().ok());
  EXPECT_EQ(recorded, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(saved_steps(root).back(), 3);
}

// A parameter gone non-finite stops the step before the optimizer applies it, naming the step
// and the tensor, and no checkpoint of it is written.
TEST(NonFinite, ANonFiniteParameterStopsTheStepBeforeTheUpdate) {
  const fs::path root = fresh_root("nan_param");
  auto t =
      launch::create_trainer(config({"checkpoint.every=1", "checkpoint.dir=" + root.string()}));
  ASSERT_TRUE(t.ok()) << t.error().message;
  ASSERT_TRUE((*t)->step().ok());
  (*t)->executor().parameter("wte").detach().fill_(NAN);
  const at::Tensor wpe = (*t)->executor().parameter("wpe").detach().clone();
  auto st = (*t)->step();
  ASSERT_FALSE(st.ok()) << "a NaN parameter was trained on";
  EXPECT_EQ(st.error().key, runtime::kNonFiniteKey);
  for (const char* want : {"step 2", "parameter 'wte'", "nan"})
    EXPECT_NE(st.error().message.find(want), std::string::npos)
        << "missing '" << want << "' in: " << st.error().message;
  EXPECT_EQ((*t)->steps_done(), 1);
  EXPECT_TRUE(at::equal((*t)->executor().parameter("wpe"), wpe)) << "the optimizer stepped";
  EXPECT_EQ(saved_steps(root), (std::vector<int64_t>{1}));
}

// optimizer.lr=1e30 diverges: the run stops naming a non-finite tensor, and every checkpoint
// written holds finite values only.
TEST(NonFinite, AHugeLearningRateStopsTheRunAndNoCheckpointHoldsItsValues) {
  const fs::path root = fresh_root("huge_lr");
  auto t = launch::create_trainer(
      config({"optimizer.type=sgd", "optimizer.lr=1e30", "optimizer.clip_grad_norm=0",
              "checkpoint.every=1", "checkpoint.keep=10", "checkpoint.dir=" + root.string()}));
  ASSERT_TRUE(t.ok()) << t.error().message;
  Status stopped = Status::success();
  for (int i = 0; i < 6 && stopped.ok(); ++i) {
    auto st = (*t)->step();
    if (!st.ok()) stopped = st.error();
  }
  ASSERT_FALSE(stopped.ok()) << "lr 1e30 trained 6 steps";
  EXPECT_EQ(stopped.error().key, runtime::kNonFiniteKey) << stopped.error().message;
  EXPECT_NE(stopped.error().message.find("non-finite"), std::string::npos)
      << stopped.error().message;
  for (const auto& [step, dir] : complete_checkpoints(root)) {
    auto reader = CheckpointReader::open(dir);
    ASSERT_TRUE(reader.ok()) << reader.error().message;
    for (const auto& name : reader->tensors(kSliceParam)) {
      auto [shape, dtype] = *reader->describe(name, kSliceParam);
      SliceRanges all;
      for (int64_t d : shape) all.emplace_back(0, d);
      const std::string bytes = *reader->read(name, kSliceParam, all);
      const float* v = reinterpret_cast<const float*>(bytes.data());
      for (size_t i = 0; i < bytes.size() / 4; ++i)
        ASSERT_TRUE(std::isfinite(v[i])) << dir << " " << name << "[" << i << "]";
    }
  }
}

// A state gone non-finite after the update (an overflow) is not written as a checkpoint.
TEST(NonFinite, AStateWithANonFiniteValueIsNeverCheckpointed) {
  const fs::path root = fresh_root("inf_state");
  auto t =
      launch::create_trainer(config({"checkpoint.every=1", "checkpoint.dir=" + root.string()}));
  ASSERT_TRUE(t.ok()) << t.error().message;
  ASSERT_TRUE((*t)->step().ok());
  (*t)->set_step_recorder([&](const runtime::StepStats&) {
    (*t)->executor().parameter("wpe").detach().view({-1})[0] = INFINITY;
    return Status::success();
  });
  auto st = (*t)->step();
  ASSERT_FALSE(st.ok()) << "a non-finite state was checkpointed";
  EXPECT_EQ(st.error().key, runtime::kNonFiniteKey);
  EXPECT_NE(st.error().message.find("param 'wpe'"), std::string::npos) << st.error().message;
  EXPECT_EQ(saved_steps(root), (std::vector<int64_t>{1}));
}

// export-hf refuses a checkpoint holding a non-finite weight, naming the tensor, and leaves no
// folder behind.
TEST_F(Checkpoint, ExportRefusesNonFiniteWeights) {
  // NaN into the stored wte of step 3, the manifest's checksum made to match.
  std::string bytes = *read_whole_file(shard());
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  const auto header = nlohmann::json::parse(bytes.substr(8, header_len));
  std::string key;
  for (const auto& [k, v] : header.items())
    if (k.rfind("param/wte/", 0) == 0) key = k;
  ASSERT_FALSE(key.empty()) << header.dump();
  const float nan = NAN;
  std::memcpy(&bytes[8 + header_len + header[key]["data_offsets"][0].get<size_t>()], &nan, 4);
  std::ofstream(shard(), std::ios::binary | std::ios::trunc) << bytes;
  auto j = manifest();
  for (auto& f : j["files"])
    if (f["name"] == "rank_00000.safetensors") f["crc32"] = crc32(bytes);
  write_manifest(j);
  auto reader = CheckpointReader::open(step3_);
  ASSERT_TRUE(reader.ok()) << reader.error().message;
  const fs::path out = root_.parent_path() / "loom_ckpt_nan_export";
  fs::remove_all(out);
  Status s = cli::export_hf(*reader, out);
  ASSERT_FALSE(s.ok()) << "NaN weights were exported";
  EXPECT_NE(s.error().message.find("'wte'"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("non-finite"), std::string::npos) << s.error().message;
  EXPECT_FALSE(fs::exists(out));
}

// A fresh run refuses a checkpoint directory holding another run's checkpoints (it would prune
// them, and resume latest would load them), changing nothing there.
TEST_F(Checkpoint, AFreshRunRefusesAnotherRunsCheckpointDirectory) {
  EXPECT_TRUE(fs::exists(root_ / runtime::CheckpointDir::kRunFile));
  const auto before = snapshot(root_);
  auto t =
      launch::create_trainer(config({"checkpoint.every=3", "checkpoint.dir=" + root_.string()}));
  ASSERT_FALSE(t.ok()) << "a fresh run took another run's checkpoint directory";
  for (const char* want : {"checkpoint.dir", "another run", "step_00000003"})
    EXPECT_NE(t.error().message.find(want), std::string::npos)
        << "missing '" << want << "' in: " << t.error().message;
  EXPECT_NE(t.error().message.find(root_.string()), std::string::npos) << t.error().message;
  EXPECT_EQ(snapshot(root_), before);
}

// Two runs cannot write one checkpoint directory at once; the second names the first's pid.
TEST_F(Checkpoint, TwoRunsCannotShareACheckpointDirectory) {
  const std::vector<std::string> resume = {"checkpoint.every=1", "checkpoint.resume=latest",
                                           "checkpoint.dir=" + root_.string()};
  auto first = launch::create_trainer(config(resume));
  ASSERT_TRUE(first.ok()) << first.error().message;
  auto second = launch::create_trainer(config(resume));
  ASSERT_FALSE(second.ok()) << "two runs share a checkpoint directory";
  EXPECT_NE(second.error().message.find("in use by another run"), std::string::npos)
      << second.error().message;
  first->reset();
  EXPECT_TRUE(launch::create_trainer(config(resume)).ok()) << "the lock outlived its run";
}

// A step_N link leading out of the checkpoint directory is never written or deleted through.
TEST_F(Checkpoint, AStepLinkLeadingOutIsRefusedNotFollowed) {
  const fs::path outside = root_.parent_path() / (root_.filename().string() + "_outside");
  fs::remove_all(outside);
  fs::create_directories(outside);
  std::ofstream(outside / "manifest.json") << "someone else's";
  // Pruning (keep 1) would delete the manifest through step_00000001.
  fs::create_directory_symlink(outside, root_ / "step_00000001");
  const std::vector<std::string> resume = {"checkpoint.every=1", "checkpoint.keep=1",
                                           "checkpoint.resume=latest",
                                           "checkpoint.dir=" + root_.string()};
  auto t = launch::create_trainer(config(resume));
  ASSERT_FALSE(t.ok()) << "a link leading out was accepted";
  EXPECT_NE(t.error().message.find((root_ / "step_00000001").string()), std::string::npos)
      << t.error().message;
  EXPECT_TRUE(fs::exists(outside / "manifest.json"));
  fs::remove(root_ / "step_00000001");

  // A link made while the run trains, where its next checkpoint goes: nothing written through it.
  auto running = launch::create_trainer(config(resume));
  ASSERT_TRUE(running.ok()) << running.error().message;
  fs::create_directory_symlink(outside, root_ / "step_00000007");
  auto st = (*running)->step();
  ASSERT_FALSE(st.ok()) << "a checkpoint was written through a link";
  EXPECT_NE(st.error().message.find((root_ / "step_00000007").string()), std::string::npos)
      << st.error().message;
  EXPECT_EQ(snapshot(outside).size(), 1u) << "a shard was written outside";
}

// checkpoint.async on 2 ranks (dp 2, zero 1: each rank writes the optimizer state it owns): the
// losses are the synchronous run's bit for bit (the state is copied, training never waits on the
// writer), and every step's checkpoint holds the same shards byte for byte and the same manifest
// but for the config it records.
TEST(AsyncCheckpoint, WritesWhatASynchronousSaveWrites) {
  const fs::path dir = fs::path(testing::TempDir()) / "loom_ckpt_async";
  fs::remove_all(dir);
  const std::vector<std::string> plan = {"parallel.dp=2", "parallel.zero=1"};
  std::vector<std::string> async = plan;
  async.push_back("checkpoint.async=true");
  const auto want =
      testing_support::train_with_checkpoints(config(plan), 2, 4, (dir / "sync").string());
  const auto got =
      testing_support::train_with_checkpoints(config(async), 2, 4, (dir / "async").string());
  ASSERT_EQ(want.size(), 4u);
  EXPECT_EQ(got, want);
  for (int step = 1; step <= 4; ++step) {
    const std::string name = "step_0000000" + std::to_string(step);
    for (const char* file : {"rank_00000.safetensors", "rank_00001.safetensors"}) {
      auto a = read_whole_file(dir / "async" / name / file);
      auto b = read_whole_file(dir / "sync" / name / file);
      ASSERT_TRUE(a.ok() && b.ok()) << name << "/" << file << " is missing";
      EXPECT_TRUE(*a == *b) << name << "/" << file << " differs";
    }
    auto a = read_whole_file(dir / "async" / name / "manifest.json");
    auto b = read_whole_file(dir / "sync" / name / "manifest.json");
    ASSERT_TRUE(a.ok() && b.ok()) << name << ": a manifest is missing";
    nlohmann::json ja = nlohmann::json::parse(*a), jb = nlohmann::json::parse(*b);
    ja.erase("config");
    jb.erase("config");
    EXPECT_EQ(ja, jb) << name;
  }
}

TEST(RunOverwrite, ConflictsWithResume) {
  auto c = parse_config(kYaml, "test.yaml", {"run.overwrite=true", "checkpoint.resume=latest"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("run.overwrite"), std::string::npos) << c.error().message;
}

TEST_F(Checkpoint, ResumePathThatIsNoCheckpoint) {
  auto t = launch::create_trainer(config({"checkpoint.resume=" + (root_ / "nowhere").string()}));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find("checkpoint.resume"), std::string::npos) << t.error().message;
  EXPECT_NE(t.error().message.find("nowhere"), std::string::npos) << t.error().message;
}

}  // namespace
}  // namespace loom
