// A training rank for the multi-process tests: GPT tiny from an inline config plus key=value
// overrides, its Comm from the launcher's environment (gloo) or mpirun (mpi). Writes, per rank,
// the losses, the peak live tensor bytes of each step and its parameter pieces to DIR/rank_K.json
// and DIR/rank_K.bin. With --die-at-step N --die-rank R, rank R kills itself with SIGKILL at the
// start of step N. With checkpoint.resume set, it trains from the checkpoint's step to --steps.
// With --plan FILE it runs the plan.json in FILE.
#include <ATen/ATen.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "launch/planned_trainer.h"
#include "lower/plan_file.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"

int main(int argc, char** argv) {
  std::string out_dir, plan_path;
  int die_step = -1, die_rank = -1, steps = 10;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--out" && i + 1 < argc)
      out_dir = argv[++i];
    else if (a == "--die-at-step" && i + 1 < argc)
      die_step = std::atoi(argv[++i]);
    else if (a == "--die-rank" && i + 1 < argc)
      die_rank = std::atoi(argv[++i]);
    else if (a == "--steps" && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (a == "--plan" && i + 1 < argc)
      plan_path = argv[++i];
    else
      overrides.push_back(a);
  }
  const char* yaml = R"(run: {seed: 3, steps: 10}
model: {type: gpt, preset: tiny}
batch: {global: 8, micro: 2}
optimizer: {type: sgd, lr: 0.3, momentum: 0.9, weight_decay: 0.01, clip_grad_norm: 1.0}
comm: {timeout_s: 60}
)";
  auto config = loom::parse_config(yaml, "worker.yaml", overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.error().message.c_str());
    return 2;
  }
  std::optional<loom::lower::PlanFile> plan;
  if (!plan_path.empty()) {
    auto loaded = loom::lower::load_plan_file(plan_path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s\n", loaded.error().message.c_str());
      return 2;
    }
    plan = std::move(*loaded);
  }
  auto trainer = loom::launch::create_trainer(*config, nullptr, plan ? &*plan : nullptr);
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", trainer.error().message.c_str());
    return 1;
  }
  const int64_t rank = (*trainer)->rank();
  std::vector<double> losses;
  const int64_t first_step = (*trainer)->steps_done() + 1;  // > 1 when resumed from a checkpoint
  std::vector<int64_t> peaks;
  for (int64_t i = first_step; i <= steps; ++i) {
    if (i == die_step && rank == die_rank) raise(SIGKILL);
    auto st = (*trainer)->step();
    if (!st.ok()) {
      std::fprintf(stderr, "rank %lld: %s\n", static_cast<long long>(rank),
                   st.error().message.c_str());
      return 1;
    }
    losses.push_back(st->loss);
    peaks.push_back(st->peak_mem_bytes);
  }
  if (out_dir.empty()) return 0;
  auto& exec = (*trainer)->executor();
  nlohmann::json index = {{"losses", losses},
                          {"first_step", first_step},
                          {"peak_mem_bytes", peaks},
                          {"params", nlohmann::json::array()}};
  std::ofstream bin(out_dir + "/rank_" + std::to_string(rank) + ".bin", std::ios::binary);
  int64_t offset = 0;
  for (size_t i = 0; i < exec.parameters().size(); ++i) {
    at::Tensor p = exec.parameters()[i].detach().contiguous();
    const auto& piece = exec.parameter_pieces()[i];
    nlohmann::json ranges = nlohmann::json::array();
    for (const auto& r : piece.ranges) ranges.push_back({r.start, r.end});
    index["params"].push_back({{"name", (*trainer)->graph().tensor(piece.tensor).name},
                               {"ranges", ranges},
                               {"offset", offset},
                               {"numel", p.numel()}});
    bin.write(reinterpret_cast<const char*>(p.data_ptr<float>()),
              static_cast<std::streamsize>(p.numel() * 4));
    offset += p.numel();
  }
  std::ofstream(out_dir + "/rank_" + std::to_string(rank) + ".json") << index.dump();
  return 0;
}
