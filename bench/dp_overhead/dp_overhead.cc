// bench/dp_overhead: the cost of data parallelism's gradient synchronisation. The same run
// alternates two setups of two processes each: dp2 (one job, gloo, gradients all-reduced) and two
// independent single-process jobs that each train on half the batch. Prints the median step time
// of each and the ratio dp2 / independent.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comm/make_comm.h"
#include "launch/planned_trainer.h"
#include "launch/spawn.h"
#include "runtime/trainer.h"

namespace {

const char* kModel = R"(run: {seed: 1, steps: 1000}
model: {type: gpt, preset: tiny, args: {layers: 4, hidden: 256, heads: 4, seq: 64, vocab: 4096}}
optimizer: {type: adamw, lr: 0.0003}
comm: {timeout_s: 120}
)";

// A worker: trains `steps` steps and prints the median step time (first step excluded).
int worker(int steps, const std::vector<std::string>& overrides) {
  loom::comm::configure_worker_threads();
  auto config = loom::parse_config(kModel, "bench", overrides);
  if (!config.ok()) return 2;
  auto trainer = loom::launch::create_trainer(*config);
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", trainer.error().message.c_str());
    return 1;
  }
  std::vector<double> times;
  for (int i = 0; i <= steps; ++i) {
    auto st = (*trainer)->step();
    if (!st.ok()) return 1;
    if (i > 0) times.push_back(st->step_time_s);
  }
  std::sort(times.begin(), times.end());
  std::printf("median_step_s %.6f\n", times[times.size() / 2]);
  return 0;
}

double median_of(const std::vector<loom::launch::ProcessResult>& results) {
  double worst = 0;
  for (const auto& r : results) {
    auto pos = r.output.find("median_step_s ");
    if (!r.ok() || pos == std::string::npos) {
      std::fprintf(stderr, "a worker failed: %s\n", r.describe().c_str());
      std::exit(1);
    }
    worst = std::max(worst, std::stod(r.output.substr(pos + 14)));
  }
  return worst;  // a step is done when its slowest process is
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2 && std::strcmp(argv[1], "--worker") == 0)
    return worker(std::atoi(argv[2]), std::vector<std::string>(argv + 3, argv + argc));
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int steps = quick ? 2 : 12, rounds = quick ? 1 : 3;
  const std::string self = "/proc/self/exe";
  char path[4096] = {0};
  if (readlink(self.c_str(), path, sizeof path - 1) <= 0) return 1;
  std::vector<double> dp, solo;
  for (int round = 0; round < rounds; ++round) {
    auto dp_runs =
        loom::launch::spawn_workers(path, 2,
                                    {"--worker", std::to_string(steps), "parallel.dp=2",
                                     "comm.backend=gloo", "batch.global=16", "batch.micro=8"},
                                    600);
    dp.push_back(median_of(dp_runs));
    std::vector<loom::launch::Launch> pair(2);
    for (auto& l : pair) {
      l.argv = {path, "--worker", std::to_string(steps), "batch.global=8", "batch.micro=8"};
      l.env = {{"LOCAL_WORLD_SIZE", "2"}};
    }
    solo.push_back(median_of(loom::launch::run_processes(pair, 600)));
  }
  std::sort(dp.begin(), dp.end());
  std::sort(solo.begin(), solo.end());
  const double d = dp[dp.size() / 2], s = solo[solo.size() / 2];
  std::printf("bench/dp_overhead: gpt (4 layers, hidden 256, seq 64), 16 samples per step\n");
  std::printf("dp2 (2 processes, gloo)        %8.2f ms/step\n", d * 1e3);
  std::printf("2 independent half-batch runs  %8.2f ms/step\n", s * 1e3);
  std::printf("ratio dp2 / independent        %8.3f\n", d / s);
  return 0;
}
