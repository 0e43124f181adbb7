// Checkpoints in one process: resuming equals the uninterrupted run bit for bit (AdamW state,
// data position, step), and every bad checkpoint (truncated, corrupted, foreign, another model
// or optimizer, a missing shard or slice, value-partial slices only) is refused with a message
// naming the file and tensor, with nothing on disk changed.
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

using namespace std::string_literals;

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "checkpoint/crc32.h"
#include "core/durable_file.h"
#include "launch/planned_trainer.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"

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

TEST_F(Checkpoint, ResumePathThatIsNoCheckpoint) {
  auto t = launch::create_trainer(config({"checkpoint.resume=" + (root_ / "nowhere").string()}));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find("checkpoint.resume"), std::string::npos) << t.error().message;
  EXPECT_NE(t.error().message.find("nowhere"), std::string::npos) << t.error().message;
}

}  // namespace
}  // namespace loom
