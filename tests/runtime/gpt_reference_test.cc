// GPT tiny in loom against the plain torch::nn reference: same weights, same batches.
#include "bench/step_overhead/gpt_reference.h"

#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "data/sources.h"
#include "launch/planned_trainer.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"

namespace loom {
namespace {

constexpr double kTolerance = 1e-5;

Config tiny_config(const std::vector<std::string>& overrides) {
  const char* yaml = R"(run: {seed: 7, steps: 20}
model: {type: gpt, preset: tiny}
batch: {global: 8, micro: 4}
optimizer: {type: adamw, lr: 0.003, betas: [0.9, 0.95], weight_decay: 0.1,
            clip_grad_norm: 1.0, warmup_steps: 3, schedule: cosine, min_lr: 0.0003}
)";
  auto c = parse_config(yaml, "tiny.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

reference::Gpt make_reference(runtime::Executor& exec) {
  reference::Gpt ref(2, 64, 4, 256, 32, 256);
  torch::NoGradGuard no_grad;
  for (auto& [name, view] : ref->loom_view(false)) {
    at::Tensor mine = exec.parameter(name);
    EXPECT_TRUE(mine.defined()) << name;
    EXPECT_EQ(mine.sizes(), view.sizes()) << name;
    view.copy_(mine);
  }
  return ref;
}

// The key projection's bias cannot change the output (see below), so its gradient is noise.
bool key_bias(const std::string& name) { return name.find("attn.k.b") != std::string::npos; }

double max_rel_error(const at::Tensor& a, const at::Tensor& b) {
  double scale = std::max(b.abs().max().item<double>(), 1e-12);
  return (a - b).abs().max().item<double>() / scale;
}

// Samples [first, first + rows) as tokens and targets, read from loom's data source.
std::pair<torch::Tensor, torch::Tensor> batch(data::TokenSource& data, int64_t first, int64_t rows,
                                              int64_t seq) {
  torch::Tensor tokens = torch::empty({rows, seq}, torch::kLong);
  torch::Tensor targets = torch::empty({rows, seq}, torch::kLong);
  std::vector<int64_t> buf(seq + 1);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(data.sample(first + r, buf.data()).ok());
    for (int64_t t = 0; t < seq; ++t) {
      tokens[r][t] = buf[t];
      targets[r][t] = buf[t + 1];
    }
  }
  return {tokens, targets};
}

TEST(GptReference, ForwardLossAndEveryGradientMatch) {
  Config config = tiny_config({"batch.global=4"});  // one micro-batch of 4 samples
  auto trainer = launch::create_trainer(config);
  ASSERT_TRUE(trainer.ok()) << trainer.error().message;
  runtime::Executor& exec = (*trainer)->executor();
  reference::Gpt ref = make_reference(exec);
  auto data = data::make_token_source(config, 256, 32);
  auto [tokens, targets] = batch(**data, 0, 4, 32);

  const graph::Graph& g = (*trainer)->graph();
  auto sums = exec.run(
      {{{g.find_tensor("tokens")->value(), tokens}, {g.find_tensor("targets")->value(), targets}}},
      1.0);
  ASSERT_TRUE(sums.ok()) << sums.error().message;
  at::Tensor loss = at::scalar_tensor(sums->loss, at::kDouble);
  torch::Tensor ref_loss = ref->forward(tokens, targets);
  ref_loss.backward();
  EXPECT_LE(max_rel_error(loss, ref_loss), kTolerance)
      << loss.item<double>() << " vs " << ref_loss.item<double>();
  int checked = 0;
  for (auto& [name, ref_grad] : ref->loom_view(true)) {
    at::Tensor grad = exec.parameter(name).grad();
    ASSERT_TRUE(grad.defined()) << name;
    if (key_bias(name)) {
      // Softmax ignores a shift shared by all keys: both gradients are zero up to rounding.
      EXPECT_LT(grad.abs().max().item<double>(), 1e-7) << name;
      EXPECT_LT(ref_grad.abs().max().item<double>(), 1e-7) << name;
    } else {
      EXPECT_LE(max_rel_error(grad, ref_grad), kTolerance) << name;
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(exec.parameters().size()));
}

// The learning rate the test expects, written out independently of loom's schedule code.
double expected_lr(int64_t step) {
  if (step < 3) return 0.003 * (step + 1) / 3.0;
  double progress = (step - 3) / 17.0;
  return 0.0003 + 0.5 * (0.003 - 0.0003) * (1 + std::cos(M_PI * progress));
}

TEST(GptReference, TwentyStepsGiveTheSameLossCurve) {
  Config config = tiny_config({});
  auto trainer = launch::create_trainer(config);
  ASSERT_TRUE(trainer.ok()) << trainer.error().message;
  reference::Gpt ref = make_reference((*trainer)->executor());
  auto data = data::make_token_source(config, 256, 32);

  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : ref->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay,
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(0.003).betas({0.9, 0.95}).weight_decay(0.1)));
  groups.emplace_back(no_decay,
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(0.003).betas({0.9, 0.95}).weight_decay(0)));
  torch::optim::AdamW opt(groups);

  for (int64_t step = 0; step < 20; ++step) {
    auto mine = (*trainer)->step();
    ASSERT_TRUE(mine.ok()) << mine.error().message;

    opt.zero_grad();
    double ref_loss = 0;
    for (int64_t m = 0; m < 2; ++m) {
      auto [tokens, targets] = batch(**data, step * 8 + m * 4, 4, 32);
      torch::Tensor loss = ref->forward(tokens, targets);
      (loss / 2.0).backward();
      ref_loss += loss.item<double>() / 2.0;
    }
    double norm = torch::nn::utils::clip_grad_norm_(ref->parameters(), 1.0);
    for (auto& group : opt.param_groups())
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(expected_lr(step));
    opt.step();

    EXPECT_NEAR(mine->lr, expected_lr(step), 1e-12) << "step " << step;
    EXPECT_LE(std::abs(mine->loss - ref_loss) / std::abs(ref_loss), kTolerance)
        << "step " << step << ": " << mine->loss << " vs " << ref_loss;
    EXPECT_LE(std::abs(mine->grad_norm - norm) / norm, 1e-4) << "step " << step;
  }
  // Adam divides by the gradient's running magnitude, so last-bit differences grow over the
  // steps; the parameters still agree to 1e-3 of their scale (the key bias only follows noise).
  for (auto& [name, view] : ref->loom_view(false))
    if (!key_bias(name)) {
      EXPECT_LE(max_rel_error((*trainer)->executor().parameter(name), view), 1e-3) << name;
    }
}

}  // namespace
}  // namespace loom
