// The Evoformer through the Trainer in separate processes: gloo over TCP, tiny preset under
// DAP 2, 5 steps on the Trainer's seeded synthetic inputs; every rank's losses and parameter
// pieces against the single-device Trainer run computed here.
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

const std::string kWorker = std::string(LOOM_BINARY_DIR) + "/bin/train_worker";
constexpr int kSteps = 5;
// The worker's inline config is GPT's; these turn it into the Evoformer run.
const std::vector<std::string> kEvoformer = {"model.type=evoformer", "model.preset=tiny",
                                             "batch.global=4",       "batch.micro=2",
                                             "optimizer.lr=0.2",     "optimizer.weight_decay=0"};

const testing_support::Reference& single_device() {
  static const testing_support::Reference r = [] {
    auto c = parse_config(R"(run: {seed: 3, steps: 10}
model: {type: evoformer, preset: tiny}
batch: {global: 4, micro: 2}
optimizer: {type: sgd, lr: 0.2, momentum: 0.9, weight_decay: 0, clip_grad_norm: 1.0}
)",
                          "ref.yaml");
    EXPECT_TRUE(c.ok()) << c.error().message;
    return testing_support::train_single_device(*c, kSteps);
  }();
  return r;
}

TEST(EvoformerGlooRanks, Dap2) {
  const testing_support::Reference& ref = single_device();
  ASSERT_GT(std::abs(ref.losses.front() - ref.losses.back()), 1e-3) << "training did not move";
  fs::path dir = fs::path(testing::TempDir()) / "loom_mp_evoformer_dap2";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<std::string> args = kEvoformer;
  for (const char* a :
       {"parallel.policy=dap", "parallel.tp=2", "comm.backend=gloo", "--steps", "5", "--out"})
    args.push_back(a);
  args.push_back(dir.string());
  auto results = launch::spawn_workers(kWorker, 2, args, 120);
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << launch::describe(results);

  // The pair norm's shift only follows rounding noise; see
  // tests/runtime/evoformer_reference_test.cc.
  EXPECT_GT(testing_support::expect_worker_results_equal(ref, dir, 2, {"msa_row.pair_ln.b"}), 200);
}

}  // namespace
}  // namespace loom
