// bench/context_parallel: context parallelism against one device. The same run alternates a Llama
// trained as cp2 (2 processes over gloo, parallel.cp 2 with ring attention: each process holds
// half of every sequence) and as one process, on the same sequence length and global batch. A
// device is one core in both setups (each process runs one intra-op thread), so a cp2 step
// without overhead would take half of one device's. A third setup, two independent processes at
// once each training on half the sequence, shows what the machine gives two processes (cp2
// without its ring: each rank's linears, no messages, a quarter of the attention scores). A fourth,
// cp2 with parallel.cp_kind p2p-contiguous, shows what zigzag order's causal load balance gives: in
// contiguous order rank 1 computes two chunks of scores and rank 0 one, in zigzag order each 1.25
// (counted as the kernel computes them: five of the eight half-chunk blocks). Prints
// the median step time of each and the ratios, and cp2's and one device's measured peak memory
// per rank (the counting allocator's, most over a step) with their ratio; next to it the part
// above the weights, gradients and AdamW state the plan estimates (what cp splits: activations).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "comm/make_comm.h"
#include "launch/planned_trainer.h"
#include "launch/spawn.h"
#include "plan/plan.h"
#include "runtime/trainer.h"

namespace {

const char* kModel = R"(run: {seed: 1, steps: 1000}
model:
  type: llama
  preset: tiny
  args: {layers: 2, hidden: 256, heads: 4, kv_heads: 2, ffn_hidden: 688, vocab: 2048, seq: 1024}
batch: {global: 2, micro: 2}
optimizer: {type: adamw, lr: 0.0003}
comm: {timeout_s: 300, backend: gloo}
)";

// A worker: trains `steps` + 1 steps and prints the median step time (first step excluded), the
// most live bytes of a step, and what its plan estimates this rank holds in weights, gradients
// and optimizer state.
int worker(int steps, const std::vector<std::string>& overrides) {
  loom::comm::configure_worker_threads();
  auto config = loom::parse_config(kModel, "bench", overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.error().message.c_str());
    return 2;
  }
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
  std::vector<double> times;
  int64_t peak = 0;
  for (int i = 0; i <= steps; ++i) {
    auto st = (*trainer)->step();
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.error().message.c_str());
      return 1;
    }
    peak = std::max(peak, st->peak_mem_bytes);
    if (i > 0) times.push_back(st->step_time_s);
  }
  std::sort(times.begin(), times.end());
  const auto& est = plan->estimate.ranks[static_cast<size_t>((*trainer)->rank())];
  std::printf("median_step_s %.6f peak %lld state %.0f\n", times[times.size() / 2],
              static_cast<long long>(peak), est.param_bytes + est.grad_bytes + est.optimizer_bytes);
  return 0;
}

struct Measured {
  double step_s = 0, peak = 0, state = 0;  // the largest over the ranks
};

Measured measured(const std::vector<loom::launch::ProcessResult>& results) {
  Measured m;
  for (const auto& r : results) {
    double step = 0, peak = 0, state = 0;
    const auto pos = r.output.find("median_step_s ");
    if (!r.ok() || pos == std::string::npos ||
        std::sscanf(r.output.c_str() + pos, "median_step_s %lf peak %lf state %lf", &step, &peak,
                    &state) != 3) {
      std::fprintf(stderr, "a worker failed: %s\n", r.describe().c_str());
      std::exit(1);
    }
    m.step_s = std::max(m.step_s, step);  // a step is done when its slowest process is
    m.peak = std::max(m.peak, peak);
    m.state = std::max(m.state, state);
  }
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2 && std::strcmp(argv[1], "--worker") == 0)
    return worker(std::atoi(argv[2]), std::vector<std::string>(argv + 3, argv + argc));
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int steps = quick ? 2 : 8, rounds = quick ? 1 : 3;
  // --quick: a quarter of the sequence, so the smoke test takes seconds.
  const std::vector<std::string> shape =
      quick ? std::vector<std::string>{"model.args.seq=256"} : std::vector<std::string>{};
  char path[4096] = {0};
  if (readlink("/proc/self/exe", path, sizeof path - 1) <= 0) return 1;
  const std::map<std::string, std::string> one_core = {{"LOCAL_WORLD_SIZE", "2"}};
  const std::string half_seq = quick ? "model.args.seq=128" : "model.args.seq=512";
  std::vector<double> cp_s, one_s, pair_s, contiguous_s;
  Measured cp, one;
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::string> args = {"--worker", std::to_string(steps), "parallel.cp=2",
                                     "parallel.cp_kind=p2p"};
    args.insert(args.end(), shape.begin(), shape.end());
    cp = measured(loom::launch::spawn_workers(path, 2, args, 900));
    cp_s.push_back(cp.step_s);
    args[3] = "parallel.cp_kind=p2p-contiguous";
    contiguous_s.push_back(measured(loom::launch::spawn_workers(path, 2, args, 900)).step_s);
    loom::launch::Launch solo;
    solo.argv = {path, "--worker", std::to_string(steps)};
    solo.argv.insert(solo.argv.end(), shape.begin(), shape.end());
    solo.env = one_core;
    one = measured(loom::launch::run_processes({solo}, 900));
    one_s.push_back(one.step_s);
    std::vector<loom::launch::Launch> pair(2);
    for (auto& l : pair) {
      l.argv = {path, "--worker", std::to_string(steps), half_seq};
      l.env = one_core;
    }
    pair_s.push_back(measured(loom::launch::run_processes(pair, 900)).step_s);
  }
  const double c = median(cp_s), o = median(one_s), p = median(pair_s), cc = median(contiguous_s);
  std::printf(
      "bench/context_parallel: llama (2 layers, hidden 256, 4 heads, 2 kv heads, seq %s), 2 "
      "samples per step, one core per device\n",
      quick ? "256" : "1024");
  std::printf("cp2 (2 processes, gloo, ring)    %9.2f ms/step (zigzag order)\n", c * 1e3);
  std::printf("cp2 contiguous order             %9.2f ms/step\n", cc * 1e3);
  std::printf("ratio zigzag / contiguous        %9.3f\n", c / cc);
  std::printf("one device (1 process)           %9.2f ms/step\n", o * 1e3);
  std::printf("ratio cp2 / one device           %9.3f\n", c / o);
  std::printf("2 independent half-sequence runs %9.2f ms/step (seq %s, at once)\n", p * 1e3,
              quick ? "128" : "512");
  std::printf("ratio cp2 / independent          %9.3f\n", c / p);
  const double mib = 1024.0 * 1024.0;
  std::printf("peak memory per rank: cp2        %9.1f MiB\n", cp.peak / mib);
  std::printf("peak memory: one device          %9.1f MiB\n", one.peak / mib);
  std::printf("ratio cp2 / one device           %9.3f\n", cp.peak / one.peak);
  std::printf("above weights, grads, AdamW state: cp2 %.1f MiB, one device %.1f MiB, ratio %.3f\n",
              (cp.peak - cp.state) / mib, (one.peak - one.state) / mib,
              (cp.peak - cp.state) / (one.peak - one.state));
  return 0;
}
