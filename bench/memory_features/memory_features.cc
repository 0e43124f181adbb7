// bench/memory_features: what the memory features save, measured against the plan's estimate.
// GPT small (4 layers, hidden 256, seq 256) trains a few steps in a process of its own per case;
// each rank reports the most live bytes of a step (the counting allocator's peak) and what
// `loom plan` estimates for it. Prints each case's measured peak, its ratio to the baseline case
// measured in the same run, and measured / estimated.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comm/make_comm.h"
#include "launch/planned_trainer.h"
#include "launch/spawn.h"
#include "plan/plan.h"
#include "runtime/trainer.h"

namespace {

const char* kModel = R"(run: {seed: 1, steps: 1000}
model: {type: gpt, preset: tiny, args: {layers: 4, hidden: 256, heads: 4, seq: 256, vocab: 4096}}
batch: {global: 8, micro: 8}
optimizer: {type: adamw, lr: 0.0003}
comm: {timeout_s: 120, backend: gloo}
)";

// A worker: trains `steps` steps, prints its rank's largest step peak and its estimate.
int worker(int steps, const std::vector<std::string>& overrides) {
  loom::comm::configure_worker_threads();
  auto config = loom::parse_config(kModel, "bench", overrides);
  if (!config.ok()) return 2;
  auto plan = loom::plan::make_plan(*config);
  if (!plan.ok()) {
    std::fprintf(stderr, "%s\n", plan.error().message.c_str());
    return 1;
  }
  auto trainer = loom::launch::create_trainer(*config);
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", trainer.error().message.c_str());
    return 1;
  }
  int64_t peak = 0;
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    auto st = (*trainer)->step();
    if (!st.ok()) return 1;
    peak = std::max(peak, st->peak_mem_bytes);
    times.push_back(st->step_time_s);
  }
  std::sort(times.begin(), times.end());
  const auto& est = plan->estimate.ranks[static_cast<size_t>((*trainer)->rank())];
  std::printf("peak %lld estimate %.0f step_s %.6f\n", static_cast<long long>(peak), est.peak_bytes,
              times[times.size() / 2]);
  return 0;
}

struct Case {
  std::string name;
  std::vector<std::string> overrides;
  int ranks = 1;
  int baseline = -1;  // index of the case it is compared with; -1: a baseline
};

struct Measured {
  double peak = 0, estimate = 0, step_s = 0;  // the largest over its ranks
};

Measured measure(const std::string& self, const Case& c, int steps) {
  std::vector<std::string> args = {"--worker", std::to_string(steps)};
  args.insert(args.end(), c.overrides.begin(), c.overrides.end());
  auto results = loom::launch::spawn_workers(self, c.ranks, args, 900);
  Measured m;
  for (const auto& r : results) {
    double peak = 0, estimate = 0, step = 0;
    auto pos = r.output.find("peak ");
    if (!r.ok() || pos == std::string::npos ||
        std::sscanf(r.output.c_str() + pos, "peak %lf estimate %lf step_s %lf", &peak, &estimate,
                    &step) != 3) {
      std::fprintf(stderr, "%s: a worker failed: %s\n", c.name.c_str(), r.describe().c_str());
      std::exit(1);
    }
    m.peak = std::max(m.peak, peak);
    m.estimate = std::max(m.estimate, estimate);
    m.step_s = std::max(m.step_s, step);
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2 && std::strcmp(argv[1], "--worker") == 0)
    return worker(std::atoi(argv[2]), std::vector<std::string>(argv + 3, argv + argc));
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int steps = quick ? 2 : 4;
  char path[4096] = {0};
  if (readlink("/proc/self/exe", path, sizeof path - 1) <= 0) return 1;
  const std::vector<Case> cases = {
      {"recompute none", {"parallel.recompute=none"}, 1, -1},
      {"recompute selective", {"parallel.recompute=selective"}, 1, 0},
      {"recompute full", {"parallel.recompute=full"}, 1, 0},
      {"dp2 zero 0", {"parallel.dp=2", "batch.global=16"}, 2, -1},
      {"dp2 zero 1", {"parallel.dp=2", "batch.global=16", "parallel.zero=1"}, 2, 3},
      {"dp2 zero 3", {"parallel.dp=2", "batch.global=16", "parallel.zero=3"}, 2, 3},
      // Sequences of 32: the parameters and their AdamW state dominate, as in large models.
      {"seq 32 dp2 zero 0", {"parallel.dp=2", "batch.global=16", "model.args.seq=32"}, 2, -1},
      {"seq 32 dp2 zero 1",
       {"parallel.dp=2", "batch.global=16", "model.args.seq=32", "parallel.zero=1"},
       2,
       6},
      {"seq 32 dp2 zero 3",
       {"parallel.dp=2", "batch.global=16", "model.args.seq=32", "parallel.zero=3"},
       2,
       6},
  };
  std::vector<Measured> got;
  for (const Case& c : cases) got.push_back(measure(path, c, steps));
  std::printf(
      "bench/memory_features: gpt (4 layers, hidden 256, heads 4, seq 256, vocab 4096), "
      "8 samples per rank per step, AdamW; peak = the most live bytes of a step on the busiest "
      "rank\n");
  std::printf("%-22s %12s %12s %10s %12s %10s\n", "case", "peak MiB", "est. MiB", "meas/est",
              "vs baseline", "step ms");
  for (size_t i = 0; i < cases.size(); ++i) {
    const Measured& m = got[i];
    const int b = cases[i].baseline;
    char ratio[32] = "-";
    if (b >= 0)
      std::snprintf(ratio, sizeof ratio, "%.3f", m.peak / got[static_cast<size_t>(b)].peak);
    std::printf("%-22s %12.1f %12.1f %10.3f %12s %10.1f\n", cases[i].name.c_str(),
                m.peak / (1 << 20), m.estimate / (1 << 20), m.peak / m.estimate, ratio,
                m.step_s * 1e3);
  }
  return 0;
}
