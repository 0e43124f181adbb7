// Fuzzing loom's readers of user files with a seeded random mutator, bounded by an iteration
// count and a few seconds: the config loader, safetensors, the checkpoint manifest, and a whole
// checkpoint directory read through CheckpointReader. Every input must give a value or an
// error naming its source; nothing may crash, throw or (in the sanitizer build) misbehave.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/crc32.h"
#include "checkpoint/merge.h"
#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"
#include "core/config.h"
#include "core/durable_file.h"
#include "tests/core/mutator.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kSeed = 0x10035EEDull;
constexpr int kIterations = 3000;
constexpr double kSeconds = 4.0;

std::vector<std::string> config_corpus() {
  std::vector<std::string> corpus = {R"(run: {seed: 3, steps: 10}
model: {type: gpt, preset: tiny, args: {layers: 4}}
parallel: {dp: 2, tp: 2, pp: 1, stages: [[0, 1], [2, 3]]}
batch: {global: 8, micro: 2}
optimizer: {type: sgd, lr: 0.3, momentum: 0.9, betas: [0.9, 0.95]}
checkpoint: {dir: /tmp/x, every: 5, keep: 2, resume: latest}
)"};
  for (const auto& e : fs::directory_iterator(fs::path(LOOM_SOURCE_DIR) / "configs"))
    if (e.path().extension() == ".yaml") corpus.push_back(*read_whole_file(e.path()));
  return corpus;
}

TEST(Fuzz, ConfigLoader) {
  auto corpus = config_corpus();
  testing::Mutator mutator(kSeed);
  int errors = 0;
  const int ran = testing::run_bounded(kIterations, kSeconds, [&](int i) {
    const std::string input =
        mutator.mutate(corpus[static_cast<size_t>(mutator.pick(static_cast<int>(corpus.size())))]);
    std::vector<std::string> overrides;
    if (i % 5 == 0) overrides.push_back(mutator.mutate("parallel.tp=2"));
    Result<Config> c = Error{};
    try {
      c = parse_config(input, "fuzz.yaml", overrides);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "seed " << kSeed << " iteration " << i << ": the loader threw '" << e.what()
                    << "' on:\n"
                    << input;
      return;
    }
    if (!c.ok()) {
      ++errors;
      EXPECT_FALSE(c.error().message.empty()) << "seed " << kSeed << " iteration " << i;
    } else {
      // A config that loads prints to YAML that loads again.
      auto again = parse_config(to_yaml(*c), "resolved.yaml");
      EXPECT_TRUE(again.ok()) << "seed " << kSeed << " iteration " << i << ": "
                              << again.error().message;
    }
  });
  std::printf("config loader: %d inputs, %d rejected\n", ran, errors);
  EXPECT_GT(errors, 0);  // the mutator does reach the error paths
}

TEST(Fuzz, SafeTensorsAndManifest) {
  SafeTensorsWriter w;
  w.add("param/w/[0:2, 0:3]", "F32", {2, 3}, std::string(24, '\x3f'));
  w.add("rng/g", "U8", {5}, "abcde");
  w.set_metadata("step", "3");
  const std::string shard = w.finish();
  CheckpointManifest m;
  m.files.push_back({"rank_00000.safetensors", shard.size(), crc32(shard)});
  m.slices.push_back(
      {"w", kSliceParam, "F32", {2, 6}, {{0, 2}, {0, 3}}, 0, 1, "rank_00000.safetensors", "k"});
  const std::string manifest = to_json(m);
  testing::Mutator mutator(kSeed + 1);
  int errors = 0;
  const int ran = testing::run_bounded(kIterations, kSeconds, [&](int i) {
    auto f = SafeTensorsFile::parse(mutator.mutate(shard), "fuzz.safetensors");
    if (!f.ok()) {
      ++errors;
      EXPECT_NE(f.error().message.find("fuzz.safetensors"), std::string::npos) << "iteration " << i;
    } else {
      for (const auto& t : f->tensors()) EXPECT_EQ(f->data(t).size(), t.end - t.begin);
    }
    auto p = parse_manifest(mutator.mutate(manifest), "fuzz.json");
    if (!p.ok()) {
      EXPECT_NE(p.error().message.find("fuzz.json"), std::string::npos) << "iteration " << i;
    }
  });
  std::printf("safetensors and manifest: %d inputs each, %d shards rejected\n", ran, errors);
  EXPECT_GT(errors, 0);
}

// A two-shard checkpoint on disk with one file mutated per iteration; the CRC is updated half
// of the time so the safetensors parser and the region assembly are reached too.
TEST(Fuzz, CheckpointDirectory) {
  const fs::path dir = fs::path(::testing::TempDir()) / "loom_fuzz_checkpoint_directory";
  fs::remove_all(dir);
  fs::create_directories(dir);
  CheckpointManifest m;
  std::vector<std::string> shards;
  for (int r = 0; r < 2; ++r) {
    SafeTensorsWriter w;
    w.add("param/w", "F32", {3, 2}, std::string(24, static_cast<char>(r + 1)));
    w.add("exp_avg/w", "F32", {3, 2}, std::string(24, '\0'));
    shards.push_back(w.finish());
    const std::string name = "rank_0000" + std::to_string(r) + ".safetensors";
    m.files.push_back({name, shards.back().size(), crc32(shards.back())});
    m.slices.push_back(
        {"w", kSliceParam, "F32", {3, 4}, {{0, 3}, {2 * r, 2 * r + 2}}, 0, 1, name, "param/w"});
    m.slices.push_back(
        {"w", kSliceExpAvg, "F32", {3, 4}, {{0, 3}, {2 * r, 2 * r + 2}}, 0, 1, name, "exp_avg/w"});
  }
  testing::Mutator mutator(kSeed + 2);
  int loaded = 0;
  const int ran = testing::run_bounded(kIterations / 3, kSeconds, [&](int i) {
    CheckpointManifest mm = m;
    std::vector<std::string> ss = shards;
    const int target = mutator.pick(3);
    if (target < 2) {
      ss[static_cast<size_t>(target)] = mutator.mutate(ss[static_cast<size_t>(target)]);
      if (mutator.pick(2)) {
        mm.files[static_cast<size_t>(target)].bytes = ss[static_cast<size_t>(target)].size();
        mm.files[static_cast<size_t>(target)].crc32 = crc32(ss[static_cast<size_t>(target)]);
      }
    }
    std::string manifest = to_json(mm);
    if (target == 2) manifest = mutator.mutate(manifest);
    for (int r = 0; r < 2; ++r)
      std::ofstream(dir / mm.files[static_cast<size_t>(r)].name, std::ios::binary | std::ios::trunc)
          << ss[static_cast<size_t>(r)];
    std::ofstream(dir / kManifestName, std::ios::binary | std::ios::trunc) << manifest;
    auto reader = CheckpointReader::open(dir);
    if (!reader.ok()) return;
    auto region = reader->read("w", kSliceParam, {{1, 3}, {1, 4}});
    if (region.ok()) {
      ++loaded;
      EXPECT_EQ(region->size(), 6u * 4u) << "iteration " << i;
    } else {
      EXPECT_FALSE(region.error().message.empty());
    }
    auto merged = merge_checkpoint(*reader);
    if (merged.ok()) {
      EXPECT_TRUE(SafeTensorsFile::parse(*merged, "merged").ok()) << "iteration " << i;
    }
  });
  std::printf("checkpoint directory: %d inputs, %d regions read\n", ran, loaded);
  EXPECT_GT(loaded, 0);  // unmutated data regions still load
}

}  // namespace
}  // namespace loom
