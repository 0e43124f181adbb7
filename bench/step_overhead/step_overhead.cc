// bench/step_overhead: the cost of loom's executor over plain LibTorch on one process.
// For each GPT config, loom's Trainer::step() and the torch::nn reference (same weights, same
// batches, AdamW, clipping) alternate step by step; the ratio of median step times is printed.
// Target: loom / reference <= 1.05.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/step_overhead/gpt_reference.h"
#include "data/sources.h"
#include "launch/planned_trainer.h"
#include "models/gpt.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Case {
  const char* name;
  std::vector<std::string> overrides;
  int steps;
};

void run_case(const Case& c) {
  std::string yaml =
      "run: {seed: 1, steps: 1000}\nmodel: {type: gpt}\n"
      "optimizer: {type: adamw, lr: 0.0003, clip_grad_norm: 1.0, weight_decay: 0.1}\n";
  auto config = loom::parse_config(yaml, "bench", c.overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.error().message.c_str());
    std::exit(2);
  }
  auto spec = loom::models::gpt_spec(*config);
  auto trainer = loom::launch::create_trainer(*config);
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", trainer.error().message.c_str());
    std::exit(2);
  }
  loom::reference::Gpt ref(spec->layers, spec->hidden, spec->heads, spec->vocab, spec->seq,
                           spec->ffn_hidden);
  {
    torch::NoGradGuard g;
    for (auto& [name, view] : ref->loom_view(false))
      view.copy_((*trainer)->executor().parameter(name));
  }
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : ref->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(3e-4).weight_decay(0.1)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(3e-4).weight_decay(0)));
  torch::optim::AdamW opt(groups);
  auto data = loom::data::make_token_source(*config, spec->vocab, spec->seq);
  const int64_t global = config->batch.global, micro = config->batch.micro, seq = spec->seq;
  int64_t ref_step = 0;
  std::vector<int64_t> buf(seq + 1);

  auto reference_step = [&] {
    opt.zero_grad();
    const int64_t chunks = global / micro;
    for (int64_t m = 0; m < chunks; ++m) {
      torch::Tensor tokens = torch::empty({micro, seq}, torch::kLong);
      torch::Tensor targets = torch::empty({micro, seq}, torch::kLong);
      for (int64_t r = 0; r < micro; ++r) {
        (void)(*data)->sample(ref_step * global + m * micro + r, buf.data());
        std::memcpy(tokens.data_ptr<int64_t>() + r * seq, buf.data(), seq * sizeof(int64_t));
        std::memcpy(targets.data_ptr<int64_t>() + r * seq, buf.data() + 1, seq * sizeof(int64_t));
      }
      torch::Tensor loss = ref->forward(tokens, targets);
      (loss / static_cast<double>(chunks)).backward();
      (void)loss.item<double>();
    }
    torch::nn::utils::clip_grad_norm_(ref->parameters(), 1.0);
    opt.step();
    ++ref_step;
  };

  std::vector<double> loom_s, ref_s;
  for (int i = 0; i <= c.steps; ++i) {  // step 0 warms both up and is not counted
    auto t0 = Clock::now();
    auto st = (*trainer)->step();
    auto t1 = Clock::now();
    reference_step();
    auto t2 = Clock::now();
    if (!st.ok()) std::exit(1);
    if (i == 0) continue;
    loom_s.push_back(std::chrono::duration<double>(t1 - t0).count());
    ref_s.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  const double l = median(loom_s), r = median(ref_s);
  std::printf("%-28s steps %3d  loom %9.2f ms  reference %9.2f ms  ratio loom/reference %.3f\n",
              c.name, c.steps, l * 1e3, r * 1e3, l / r);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  at::set_num_threads(std::max(1, at::get_num_threads()));
  std::vector<Case> cases = {
      {"gpt tiny (b8 s32)",
       {"model.preset=tiny", "batch.global=8", "batch.micro=8"},
       quick ? 3 : 60},
  };
  if (!quick)
    cases.push_back(
        {"gpt2-124m (b2 s64)",
         {"model.preset=gpt2-124m", "model.args.seq=64", "batch.global=2", "batch.micro=2"},
         6});
  std::printf(
      "bench/step_overhead: median step time, loom executor vs plain LibTorch (%d threads)\n",
      at::get_num_threads());
  for (const auto& c : cases) run_case(c);
  return 0;
}
