// Training on a GPU equals training on the CPU: GPT, Llama, a mixture of experts, Swin and the
// Evoformer (tiny presets) on cuda in fp32 against the CPU run
// (losses and parameters, the suite's tolerance policy: the GPU sums the same products in
// another order, as a plan does; TF32 is off), bf16 on cuda against fp32 on cuda, a checkpoint
// saved on cuda resumed on the CPU and the other way round, and `loomrun --nproc-per-node 1
// loom train ... run.device=cuda` end to end. Labelled `gpu`: scripts/gpu-check runs them on a
// GPU machine; elsewhere every test skips and says why.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/planned_trainer.h"
#include "launch/run_device.h"
#include "runtime/device.h"
#include "tests/support/need_gpu.h"
#include "tests/support/reference_run.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

// GPT tiny, or `model` ("type: T, preset: P") with the same batches and optimizer.
Config config(const std::vector<std::string>& overrides,
              const std::string& model = "type: gpt, preset: tiny") {
  const std::string yaml = R"(run: {seed: 3}
model: {)" + model + R"(}
batch: {global: 8, micro: 2}
optimizer: {type: sgd, lr: 0.3, momentum: 0.9, weight_decay: 0.01, clip_grad_norm: 1.0}
)";
  auto c = parse_config(yaml, "gpu.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

struct Trained {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;  // on the host
};

Trained train(const Config& c, int steps) {
  Trained r;
  auto t = launch::create_trainer(c);
  EXPECT_TRUE(t.ok()) << t.error().message;
  if (!t.ok()) return r;
  for (int i = 0; i < steps; ++i) {
    auto st = (*t)->step();
    EXPECT_TRUE(st.ok()) << st.error().message;
    if (!st.ok()) return r;
    r.losses.push_back(st->loss);
    if (c.run.device == "cuda") {
      EXPECT_GT(st->peak_mem_bytes, 0);
    }
  }
  for (auto& [name, p] : testing_support::parameters_of(**t)) r.params[name] = p.cpu();
  return r;
}

// Gradients that are rounding noise by construction (see launch::rounding_noise_parameters).
bool is_noise(const std::string& name) {
  return name.find("attn.k.b") != std::string::npos ||
         name.find("msa_row.pair_ln.b") != std::string::npos;
}

// `model` trained on cuda in fp32 for 10 steps equals the same run on the CPU.
void expect_cuda_equals_cpu(const std::string& model) {
  LOOM_NEED_GPU();
  const int steps = 10;
  const testing_support::Reference cpu =
      testing_support::train_single_device(config({}, model), steps);
  const Trained gpu = train(config({"run.device=cuda"}, model), steps);
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  for (int i = 0; i < steps; ++i)
    EXPECT_LE(std::abs(gpu.losses[i] - cpu.losses[i]) / cpu.losses[i],
              testing_support::loss_tolerance(cpu.trace))
        << "step " << i + 1 << ": cuda " << gpu.losses[i] << " vs cpu " << cpu.losses[i];
  ASSERT_EQ(gpu.params.size(), cpu.params.size());
  for (const auto& [name, want] : cpu.params) {
    if (is_noise(name)) continue;
    const auto differs =
        testing_support::compare_parameter(gpu.params.at(name), want, cpu.init.at(name),
                                           testing_support::parameter_tolerance(cpu.trace, name));
    EXPECT_FALSE(differs) << name << ": " << *differs;
  }
}

TEST(Gpu, GptTinyFp32EqualsTheCpu) { expect_cuda_equals_cpu("type: gpt, preset: tiny"); }
// RMSNorm, rotary positions, grouped-query attention, SwiGLU.
TEST(Gpu, LlamaTinyFp32EqualsTheCpu) { expect_cuda_equals_cpu("type: llama, preset: tiny"); }
// Top-k routing, dispatch into expert slots, the experts' grouped products, combine.
TEST(Gpu, MoeTinyFp32EqualsTheCpu) { expect_cuda_equals_cpu("type: llama, preset: tiny-moe"); }
// Patch merging, shifted windows and their masks.
TEST(Gpu, SwinTinyFp32EqualsTheCpu) { expect_cuda_equals_cpu("type: swin, preset: tiny"); }
// Row and column attention with pair bias, triangle updates, outer-product mean.
TEST(Gpu, EvoformerTinyFp32EqualsTheCpu) {
  expect_cuda_equals_cpu("type: evoformer, preset: tiny");
}

// bf16 on the GPU (tensor-core matrix products, flash attention where LibTorch has it) follows
// fp32 on the GPU as bf16 follows fp32 on the CPU (tests/runtime/precision_test.cc: GPT tiny
// measured 0.04 % there; the same 0.2 % bound).
TEST(Gpu, Bf16FollowsFp32) {
  LOOM_NEED_GPU();
  const int steps = 30;
  // precision_test.cc's GPT configuration: AdamW, micro-batches of 4.
  const std::vector<std::string> adamw = {"run.device=cuda", "batch.micro=4",
                                          "optimizer.type=adamw", "optimizer.lr=0.003"};
  std::vector<std::string> in_bf16 = adamw;
  in_bf16.push_back("run.precision=bf16");
  const Trained fp32 = train(config(adamw), steps);
  const Trained bf16 = train(config(in_bf16), steps);
  ASSERT_EQ(fp32.losses.size(), static_cast<size_t>(steps));
  ASSERT_EQ(bf16.losses.size(), static_cast<size_t>(steps));
  double differs = 0;
  for (int i = 0; i < steps; ++i) {
    differs = std::max(differs, std::abs(bf16.losses[i] - fp32.losses[i]) / fp32.losses[i]);
    EXPECT_LE(std::abs(bf16.losses[i] - fp32.losses[i]) / fp32.losses[i], 2e-3)
        << "step " << i + 1 << ": bf16 " << bf16.losses[i] << " vs fp32 " << fp32.losses[i];
  }
  EXPECT_GT(differs, 1e-5) << "the bf16 losses equal the fp32 ones: bf16 did not run";
}

// A checkpoint holds host tensors: saved on one device, it resumes on the other, and the resumed
// run continues the uninterrupted CPU run's losses (the suite's loss tolerance: the devices sum
// in other orders).
void expect_resume(const std::string& first, const std::string& second) {
  LOOM_NEED_GPU();
  const fs::path dir = fs::path(testing::TempDir()) / ("loom_gpu_ckpt_" + first + "_" + second);
  fs::remove_all(dir);
  const std::string ckpt = "checkpoint.dir=" + (dir / "ckpt").string();
  const Trained straight = train(config({"run.device=cpu"}), 6);
  const Trained saved =
      train(config({"run.device=" + first, ckpt, "checkpoint.every=3", "run.steps=3"}), 3);
  ASSERT_EQ(saved.losses.size(), 3u);
  const Trained resumed =
      train(config({"run.device=" + second, ckpt, "checkpoint.resume=latest", "run.steps=6"}), 3);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (int i = 0; i < 3; ++i)
    EXPECT_LE(std::abs(resumed.losses[i] - straight.losses[3 + i]) / straight.losses[3 + i],
              testing_support::kLossRelTolerance)
        << "step " << i + 4 << " after resuming on " << second;
  fs::remove_all(dir);
}
TEST(Gpu, CheckpointSavedOnCudaResumesOnTheCpu) { expect_resume("cuda", "cpu"); }
TEST(Gpu, CheckpointSavedOnTheCpuResumesOnCuda) { expect_resume("cpu", "cuda"); }

// The launcher and the CLI as a user runs them on one GPU.
TEST(Gpu, LoomrunTrainsOnCuda) {
  LOOM_NEED_GPU();
  const fs::path dir = fs::path(testing::TempDir()) / "loom_gpu_loomrun";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "c.yaml") << "run: {steps: 8, device: cuda, output_dir: " +
                                       (dir / "run").string() +
                                       "}\nmodel: {type: gpt, preset: tiny}\n"
                                       "batch: {global: 8, micro: 4}\noptimizer: {lr: 0.003}\n";
  const std::string bin = std::string(LOOM_BINARY_DIR) + "/bin/";
  const std::string cmd = bin + "loomrun --nproc-per-node 1 --standalone " + bin + "loom train " +
                          (dir / "c.yaml").string() + " > " + (dir / "log").string() + " 2>&1";
  const int status = std::system(cmd.c_str());
  std::ifstream log_in(dir / "log");
  const std::string log((std::istreambuf_iterator<char>(log_in)), {});
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  std::vector<nlohmann::json> steps;
  for (std::string line; std::getline(metrics, line);)
    if (!line.empty()) steps.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(steps.size(), 8u) << log;
  EXPECT_LT(steps.back()["loss"].get<double>(), steps.front()["loss"].get<double>());
  EXPECT_GT(steps.back()["peak_mem_bytes"].get<double>(), 0);
  fs::remove_all(dir);
}

// run.deterministic: two runs of the same plan and seed are bitwise equal, losses and
// parameters, and a run resumed from its checkpoint continues the uninterrupted one bitwise.
void expect_bitwise_repeatable(const std::string& model, const std::vector<std::string>& keys) {
  const fs::path dir = fs::path(testing::TempDir()) / "loom_deterministic";
  fs::remove_all(dir);
  std::vector<std::string> saving = keys;
  saving.insert(saving.end(),
                {"run.deterministic=true", "checkpoint.dir=" + (dir / "ckpt").string(),
                 "checkpoint.every=3", "checkpoint.keep=5", "run.steps=6"});
  std::vector<std::string> again = keys;
  again.push_back("run.deterministic=true");
  std::vector<std::string> resuming = again;
  resuming.insert(resuming.end(), {"checkpoint.dir=" + (dir / "ckpt").string(),
                                   "checkpoint.resume=" + (dir / "ckpt" / "step_00000003").string(),
                                   "run.steps=6"});
  const Trained first = train(config(saving, model), 6);
  const Trained second = train(config(again, model), 6);
  const Trained resumed = train(config(resuming, model), 3);
  at::globalContext().setDeterministicAlgorithms(false, false);
  ASSERT_EQ(first.losses.size(), 6u);
  ASSERT_EQ(second.losses.size(), 6u);
  ASSERT_EQ(resumed.losses.size(), 3u);
  EXPECT_NE(first.losses.front(), first.losses.back()) << "the losses do not move";
  for (int i = 0; i < 6; ++i) EXPECT_EQ(first.losses[i], second.losses[i]) << "step " << i + 1;
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(resumed.losses[i], first.losses[3 + i]) << "step " << i + 4 << " after resuming";
  ASSERT_EQ(first.params.size(), second.params.size());
  for (const auto& [name, p] : first.params) {
    EXPECT_TRUE(at::equal(p, second.params.at(name))) << name << " differs between two runs";
    EXPECT_TRUE(at::equal(p, resumed.params.at(name))) << name << " differs after resuming";
  }
  fs::remove_all(dir);
}

// On a GPU, bf16 at a size where the kernels split their work (flash attention's backward
// accumulates over query blocks, cuBLAS over k), so an order that varied would show.
TEST(Gpu, DeterministicRunsAreBitwiseEqualAndSoIsAResumedOne) {
  LOOM_NEED_GPU();
  expect_bitwise_repeatable(
      "type: gpt, preset: tiny, args: {layers: 4, hidden: 512, heads: 8, vocab: 4096, seq: 512}",
      {"run.device=cuda", "run.precision=bf16", "batch.micro=4", "optimizer.type=adamw",
       "optimizer.lr=0.001"});
}

// The same contract on the CPU (no GPU needed): the mode, the checkpoint's fidelity (masters,
// optimizer state, the data position) and the resumed step counter.
// A CPU run with fixed threads repeats itself with or without the mode, so the mode itself is
// checked first: select_device turns LibTorch's deterministic algorithms on (an op without one
// then fails instead of varying) and says so in the device's description.
TEST(Deterministic, OnTheCpuARunAndItsResumeAreBitwiseEqual) {
  at::set_num_threads(1);
  at::globalContext().setDeterministicAlgorithms(false, false);
  auto d = launch::select_device(config({"run.deterministic=true"}), 0);
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
  EXPECT_FALSE(at::globalContext().deterministicAlgorithmsWarnOnly());
  EXPECT_TRUE(d->deterministic);
  EXPECT_NE(d->to_string().find("deterministic"), std::string::npos) << d->to_string();
  at::globalContext().setDeterministicAlgorithms(false, false);
  expect_bitwise_repeatable("type: gpt, preset: tiny",
                            {"batch.micro=4", "optimizer.type=adamw", "optimizer.lr=0.003"});
}

}  // namespace
}  // namespace loom
