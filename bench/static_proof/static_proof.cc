// bench/static_proof: `loom verify --static`'s proof (lower/equivalence.h) on tiny plans and on
// the two paper-scale plans of VERDICT (SOSP'25): GPT-3 175B under dp16 x tp8 x pp8 and
// Llama 3.1 405B under dp8 x tp8 x pp16 (configs/llama3.1-405b.yaml), 1,024 ranks each.
// Prints, per plan, the time to make it (make_plan without the proof: the baseline measured in
// the same run) and the time to prove it, with the proof's ratio to planning. Target: tiny
// plans < 1 s, each 1,024-rank proof <= 60 s on 2 cores. --quick: the tiny plans and a 64-rank
// GPT-3 plan (ctest's smoke run).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "lower/equivalence.h"
#include "plan/plan.h"

namespace {

struct Case {
  std::string name;
  std::string yaml;
  std::vector<std::string> overrides;
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

bool run(const Case& c) {
  auto config = loom::parse_config(c.yaml, c.name + ".yaml", c.overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "%s: %s\n", c.name.c_str(), config.error().message.c_str());
    return false;
  }
  auto cost = loom::resolve_cost_model(*config);
  if (!cost.ok()) return false;
  loom::plan::PlanProofs proofs;
  proofs.equivalent = false;
  auto start = std::chrono::steady_clock::now();
  auto plan = loom::plan::make_plan(*config, loom::plan::Registries{}, *cost, 0, proofs);
  const double plan_s = seconds_since(start);
  if (!plan.ok()) {
    std::fprintf(stderr, "%s: %s\n", c.name.c_str(), plan.error().message.c_str());
    return false;
  }
  loom::lower::ProofStats stats;
  start = std::chrono::steady_clock::now();
  loom::Status proven = loom::lower::prove_equivalent(
      plan->model, plan->file.graph, plan->file.lowered, plan->file.micro_batches, &stats);
  const double prove_s = seconds_since(start);
  if (!proven.ok()) {
    std::fprintf(stderr, "%s: NOT proven: %s\n", c.name.c_str(), proven.error().message.c_str());
    return false;
  }
  std::printf(
      "%-26s %5lld ranks %8lld sub-ops %6lld adapters %8lld blocks  plan %7.2f s  "
      "proof %7.3f s  (x%.2f of planning)\n",
      c.name.c_str(), static_cast<long long>(plan->world_size()), static_cast<long long>(stats.ops),
      static_cast<long long>(stats.adapters), static_cast<long long>(stats.blocks), plan_s, prove_s,
      prove_s / plan_s);
  std::fflush(stdout);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const std::string gpt_tiny =
      "model: {type: gpt, preset: tiny}\nbatch: {global: 8, micro: 2}\n"
      "optimizer: {type: sgd, lr: 0.05}\n";
  const std::string gpt3 =
      "model: {type: gpt, preset: gpt3-175b}\nparallel: {tp: 8, pp: 8, schedule: 1f1b}\n"
      "batch: {global: 1024, micro: 1}\ncost: {preset: h100}\n";
  const std::string llama405 =
      "model: {type: llama, preset: llama3.1-405b}\n"
      "parallel: {dp: 8, tp: 8, pp: 16, schedule: 1f1b, recompute: full, zero: 1}\n"
      "run: {device: cuda, precision: bf16}\nbatch: {global: 512, micro: 1}\n"
      "cost: {preset: h100}\n";
  std::vector<Case> cases = {
      {"gpt-tiny dp2", gpt_tiny, {"parallel.dp=2"}},
      {"gpt-tiny tp2 x pp2", gpt_tiny, {"parallel.tp=2", "parallel.pp=2"}},
      {"gpt-tiny dp2 x tp2 x pp2", gpt_tiny, {"parallel.dp=2", "parallel.tp=2", "parallel.pp=2"}},
      {"gpt-tiny dp2 zero3", gpt_tiny, {"parallel.dp=2", "parallel.zero=3"}},
  };
  if (quick)
    cases.push_back({"gpt3-175b tp8 x pp8", gpt3, {"parallel.dp=1", "batch.global=64"}});
  else {
    cases.push_back({"gpt3-175b dp16 x tp8 x pp8", gpt3, {"parallel.dp=16"}});
    cases.push_back({"llama3.1-405b dp8 x tp8 x pp16", llama405, {}});
  }
  std::printf("bench/static_proof: make_plan, then lower::prove_equivalent\n");
  for (const Case& c : cases)
    if (!run(c)) return 1;
  return 0;
}
