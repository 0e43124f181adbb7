// Multi-rank plans on one GPU with every rank a thread over the local backend, each rank's
// tensors on the same CUDA device (LibTorch's default stream, shared by the ranks' threads,
// orders one rank's kernels before the contributions another rank reads). Each plan's losses
// and parameters equal the CPU run of one device under the suite's tolerance policy (the GPU
// sums in other orders, as a plan does; TF32 off). Labelled `gpu` with the rest of test_gpu:
// without a GPU every test skips, saying why.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "launch/verify.h"
#include "runtime/device.h"
#include "tests/runtime/local_ranks.h"
#include "tests/support/need_gpu.h"

namespace loom {
namespace {

constexpr int kSteps = 4;

Config config(const std::string& model, int64_t micro, const std::vector<std::string>& overrides) {
  const std::string yaml = "run: {seed: 5}\nmodel: {" + model +
                           "}\nbatch: {global: 8, micro: " + std::to_string(micro) +
                           "}\noptimizer: {type: sgd, lr: 0.3, momentum: 0.9, weight_decay: 0.01, "
                           "clip_grad_norm: 1.0}\ncomm: {timeout_s: 60}\n";
  auto c = parse_config(yaml, "gpu_ranks.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

// `plan` on `world` ranks sharing the GPU against the CPU's one-device run. The micro-batch
// of one replica is `micro` on one device and micro / dp under the plan, so both see the same
// samples per micro-batch (a mixture of experts' auxiliary loss is a per-micro-batch mean).
void expect_plan_on_gpu(const std::string& model, const std::vector<std::string>& plan, int world,
                        int64_t dp = 1, int64_t micro = 4) {
  LOOM_NEED_GPU();
  const testing_support::Reference cpu =
      testing_support::train_single_device(config(model, micro, {}), kSteps);
  std::vector<std::string> on_gpu = plan;
  on_gpu.push_back("run.device=cuda");
  testing_support::expect_equal_to_single_device(cpu, config(model, micro / dp, on_gpu), world,
                                                 launch::rounding_noise_parameters());
}

// Plans whose exchanges all run outside the backward passes: the pipeline's transfers and the
// data-parallel gradient sums (started by the gradient hooks, waited for after the backward).
TEST(GpuRanks, Pp2OneFOneBEqualsTheCpu) {
  expect_plan_on_gpu("type: gpt, preset: tiny", {"parallel.pp=2", "parallel.schedule=1f1b"}, 2);
}
TEST(GpuRanks, Dp2Zero1EqualsTheCpu) {
  expect_plan_on_gpu("type: gpt, preset: tiny", {"parallel.dp=2", "parallel.zero=1"}, 2, 2);
}
TEST(GpuRanks, Dp2Pp2InterleavedEqualsTheCpu) {
  expect_plan_on_gpu(
      "type: gpt, preset: tiny, args: {layers: 8}",
      {"parallel.dp=2", "parallel.pp=2", "parallel.schedule=interleaved", "parallel.chunks=2"}, 4,
      2);
}

// Plans with an exchange inside a backward pass (tensor and sequence parallelism, ZeRO 3,
// context and expert parallelism): LibTorch's autograd runs every thread's backward on one
// thread per GPU, so ranks as threads would wait for each other until the timeout. Each is
// refused before step 1, on every rank, naming the exchange and what to do instead.
void expect_refused_on_gpu(const std::string& model, std::vector<std::string> plan, int world,
                           int64_t dp = 1) {
  LOOM_NEED_GPU();
  plan.push_back("run.device=cuda");
  const Config c = config(model, 4 / dp, plan);
  comm::LocalWorld threads(world, 60);
  std::mutex mu;
  std::vector<std::string> messages;
  const auto start = std::chrono::steady_clock::now();
  const auto statuses = threads.run([&](comm::Comm& comm) -> Status {
    at::set_num_threads(1);
    auto trainer = launch::create_trainer(c, comm.shared_from_this());
    std::lock_guard<std::mutex> lock(mu);
    messages.push_back(trainer.ok() ? "a trainer was made" : trainer.error().to_string());
    return Status::success();
  });
  ASSERT_EQ(messages.size(), static_cast<size_t>(world));
  for (const std::string& m : messages) {
    EXPECT_NE(m.find("run.device"), std::string::npos) << m;
    EXPECT_NE(m.find("runs inside the backward pass"), std::string::npos) << m;
  }
  // Refused at once, not by the 60 s timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(GpuRanks, PlansWithExchangesInTheBackwardAreRefusedAsThreads) {
  expect_refused_on_gpu("type: gpt, preset: tiny", {"parallel.tp=2", "parallel.sp=true"}, 2);
  expect_refused_on_gpu("type: gpt, preset: tiny", {"parallel.dp=2", "parallel.zero=3"}, 2, 2);
  expect_refused_on_gpu("type: llama, preset: tiny", {"parallel.cp=2"}, 2);
  expect_refused_on_gpu("type: gpt, preset: tiny-moe", {"parallel.dp=2", "parallel.ep=2"}, 2, 2);
}

}  // namespace
}  // namespace loom
