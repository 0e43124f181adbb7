// Swin tiny in separate processes (gloo over TCP) equals one device: window parallelism 2 and
// data parallelism 2 x tensor parallelism 2, 5 steps; every rank's losses and parameter pieces
// against the single-device run computed here with the worker's config.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "launch/spawn.h"
#include "tests/support/reference_run.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 5;
const std::string kWorker = std::string(LOOM_BINARY_DIR) + "/bin/train_worker";
const std::vector<std::string> kSwin = {"model.type=swin", "model.preset=tiny", "batch.global=4",
                                        "optimizer.lr=0.1"};

// The worker's inline config (tests/e2e/train_worker.cc) with the Swin overrides.
const testing_support::Reference& single_device() {
  static const testing_support::Reference r = [] {
    auto c = parse_config(R"(run: {seed: 3, steps: 10}
model: {type: gpt, preset: tiny}
batch: {global: 8, micro: 2}
optimizer: {type: sgd, lr: 0.3, momentum: 0.9, weight_decay: 0.01, clip_grad_norm: 1.0}
)",
                          "ref.yaml", kSwin);
    EXPECT_TRUE(c.ok()) << c.error().message;
    return testing_support::train_single_device(*c, kSteps);
  }();
  return r;
}

void expect_gloo_equal(const std::string& name, const std::vector<std::string>& overrides,
                       int world_size) {
  const fs::path dir = fs::path(testing::TempDir()) / ("loom_swin_mp_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<std::string> args = kSwin;
  args.insert(args.end(), overrides.begin(), overrides.end());
  for (std::string a : {"comm.backend=gloo", "--steps", "5", "--out"}) args.push_back(a);
  args.push_back(dir.string());
  auto results = launch::spawn_workers(kWorker, world_size, args, 120);
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << launch::describe(results);

  const testing_support::Reference& ref = single_device();
  ASSERT_NE(ref.losses.front(), ref.losses.back());
  // The key bias only follows rounding noise; see distributed_test.cc.
  EXPECT_GT(testing_support::expect_worker_results_equal(ref, dir, world_size, {"attn.k.b"}), 0);
}

TEST(SwinGlooRanks, WindowParallel2) {
  expect_gloo_equal("window2", {"parallel.policy=window", "parallel.tp=2"}, 2);
}
TEST(SwinGlooRanks, Dp2Tp2) { expect_gloo_equal("dp2tp2", {"parallel.dp=2", "parallel.tp=2"}, 4); }

}  // namespace
}  // namespace loom
