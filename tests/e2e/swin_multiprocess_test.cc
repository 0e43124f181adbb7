// Swin tiny in separate processes (gloo over TCP) equals one device: window parallelism 2 and
// data parallelism 2 x tensor parallelism 2, 5 steps; every rank's losses and parameter pieces
// against the single-device run computed here with the worker's config.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "exec/runtime/executor.h"
#include "exec/runtime/oracle.h"
#include "exec/runtime/trainer.h"
#include "tests/exec/comm/spawn.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 5;
const std::string kWorker = std::string(LOOM_BINARY_DIR) + "/bin/train_worker";
const std::vector<std::string> kSwin = {"model.type=swin", "model.preset=tiny", "batch.global=4",
                                        "optimizer.lr=0.1"};

struct Reference {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
};

// The worker's inline config (tests/e2e/train_worker.cc) with the Swin overrides.
const Reference& single_device() {
  static Reference r = [] {
    Reference ref;
    auto c = parse_config(R"(run: {seed: 3, steps: 10}
model: {type: gpt, preset: tiny}
batch: {global: 8, micro: 2}
optimizer: {type: sgd, lr: 0.3, momentum: 0.9, weight_decay: 0.01, clip_grad_norm: 1.0}
)",
                          "ref.yaml", kSwin);
    EXPECT_TRUE(c.ok()) << c.error().message;
    auto t = runtime::Trainer::create(*c);
    EXPECT_TRUE(t.ok()) << t.error().message;
    for (int i = 0; i < kSteps; ++i) ref.losses.push_back((*t)->step()->loss);
    for (const auto& tensor : (*t)->graph().tensors())
      if (tensor.role == graph::TensorRole::kParameter)
        ref.params[tensor.name] = (*t)->executor().parameter(tensor.name).detach().clone();
    return ref;
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
  auto results = comm::testing::spawn_workers(kWorker, world_size, args, 120);
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << comm::testing::describe(results);

  const Reference& ref = single_device();
  ASSERT_NE(ref.losses.front(), ref.losses.back());
  for (int r = 0; r < world_size; ++r) {
    std::ifstream idx(dir / ("rank_" + std::to_string(r) + ".json"));
    ASSERT_TRUE(idx) << "rank " << r << " wrote no results";
    nlohmann::json index = nlohmann::json::parse(idx);
    std::ifstream bin(dir / ("rank_" + std::to_string(r) + ".bin"), std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(bin)),
                            std::istreambuf_iterator<char>());
    const float* data = reinterpret_cast<const float*>(bytes.data());
    auto losses = index["losses"].get<std::vector<double>>();
    ASSERT_EQ(losses.size(), ref.losses.size());
    for (size_t i = 0; i < losses.size(); ++i)
      EXPECT_LE(std::abs(losses[i] - ref.losses[i]) / ref.losses[i], 1e-5)
          << "rank " << r << " step " << i + 1 << ": " << losses[i] << " vs " << ref.losses[i];
    int checked = 0;
    for (const auto& p : index["params"]) {
      const std::string pname = p["name"];
      if (pname.find("attn.k.b") != std::string::npos) continue;  // see distributed_test.cc
      graph::SubTensor piece;
      for (const auto& range : p["ranges"]) piece.ranges.push_back({range[0], range[1]});
      at::Tensor want = runtime::cut_piece(ref.params.at(pname), piece);
      at::Tensor got = at::from_blob(const_cast<float*>(data) + p["offset"].get<int64_t>(),
                                     want.sizes(), at::kFloat);
      double err =
          (got - want).abs().max().item<double>() / std::max(want.abs().max().item<double>(), 1e-6);
      EXPECT_LE(err, 1e-5) << "rank " << r << " " << pname << piece.ranges_string();
      ++checked;
    }
    EXPECT_GT(checked, 0) << "rank " << r;
  }
}

TEST(SwinGlooRanks, WindowParallel2) {
  expect_gloo_equal("window2", {"parallel.policy=window", "parallel.tp=2"}, 2);
}
TEST(SwinGlooRanks, Dp2Tp2) { expect_gloo_equal("dp2tp2", {"parallel.dp=2", "parallel.tp=2"}, 4); }

}  // namespace
}  // namespace loom
