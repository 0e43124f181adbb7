// The Evoformer through the Trainer in separate processes: gloo over TCP, tiny preset under
// DAP 2, 5 steps on the Trainer's seeded synthetic inputs; every rank's losses and parameter
// pieces against the single-device Trainer run computed here.
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

const std::string kWorker = std::string(LOOM_BINARY_DIR) + "/bin/train_worker";
constexpr int kSteps = 5;
// The worker's inline config is GPT's; these turn it into the Evoformer run.
const std::vector<std::string> kEvoformer = {"model.type=evoformer", "model.preset=tiny",
                                             "batch.global=4",       "batch.micro=2",
                                             "optimizer.lr=0.2",     "optimizer.weight_decay=0"};

struct Reference {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
};

const Reference& single_device() {
  static Reference r = [] {
    Reference ref;
    auto c = parse_config(R"(run: {seed: 3, steps: 10}
model: {type: evoformer, preset: tiny}
batch: {global: 4, micro: 2}
optimizer: {type: sgd, lr: 0.2, momentum: 0.9, weight_decay: 0, clip_grad_norm: 1.0}
)",
                          "ref.yaml");
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

TEST(EvoformerGlooRanks, Dap2) {
  const Reference& ref = single_device();
  ASSERT_GT(std::abs(ref.losses.front() - ref.losses.back()), 1e-3) << "training did not move";
  fs::path dir = fs::path(testing::TempDir()) / "loom_mp_evoformer_dap2";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<std::string> args = kEvoformer;
  for (const char* a :
       {"parallel.policy=dap", "parallel.tp=2", "comm.backend=gloo", "--steps", "5", "--out"})
    args.push_back(a);
  args.push_back(dir.string());
  auto results = comm::testing::spawn_workers(kWorker, 2, args, 120);
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << comm::testing::describe(results);

  for (int r = 0; r < 2; ++r) {
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
      const std::string name = p["name"];
      // Rounding noise only; see tests/exec/evoformer_reference_test.cc.
      if (name.find("msa_row.pair_ln.b") != std::string::npos) continue;
      graph::SubTensor piece;
      for (const auto& range : p["ranges"]) piece.ranges.push_back({range[0], range[1]});
      at::Tensor want = runtime::cut_piece(ref.params.at(name), piece);
      at::Tensor got = at::from_blob(const_cast<float*>(data) + p["offset"].get<int64_t>(),
                                     want.sizes(), at::kFloat);
      double err =
          (got - want).abs().max().item<double>() / std::max(want.abs().max().item<double>(), 1e-6);
      EXPECT_LE(err, 1e-5) << "rank " << r << " " << name << piece.ranges_string();
      ++checked;
    }
    EXPECT_GT(checked, 100) << "rank " << r;
  }
}

}  // namespace
}  // namespace loom
