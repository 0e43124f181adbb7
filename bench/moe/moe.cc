// bench/moe: expert parallelism against one device. The same run alternates a Llama with 8
// experts per layer (top 2) trained as ep2 (dp 2, each process holding 4 experts, tokens moved
// by all-to-all over gloo) and as one process on the same global batch and micro-batches. Prints
// the median step time of each, their ratio, and the share of an ep2 step that rank 0 spends in
// all-to-all (from a traced step).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/make_comm.h"
#include "launch/planned_trainer.h"
#include "launch/spawn.h"
#include "runtime/trainer.h"

namespace {

namespace fs = std::filesystem;

const char* kModel = R"(run: {seed: 1, steps: 1000}
model:
  type: llama
  preset: tiny-moe
  args: {layers: 4, hidden: 256, heads: 4, kv_heads: 2, seq: 64, vocab: 4096,
         moe: {experts: 8, top_k: 2, ffn_hidden: 512}}
batch: {global: 16}
optimizer: {type: adamw, lr: 0.0003}
comm: {timeout_s: 120}
)";

// Seconds rank 0 spent in all_to_all in the chrome trace at `path` (microsecond durations).
double all_to_all_seconds(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return -1;
  const nlohmann::json trace = nlohmann::json::parse(in, nullptr, false);
  double us = 0;
  const nlohmann::json& events = trace.is_object() ? trace["traceEvents"] : trace;
  for (const auto& e : events)
    if (e.value("pid", -1) == 0 && e.value("ph", "") == "X" &&
        e.value("name", "").find("all_to_all") != std::string::npos)
      us += e.value("dur", 0.0);
  return us * 1e-6;
}

// A worker: trains steps + 2 steps (the last one traced) and prints the median step time (first
// step excluded) and, on rank 0, the traced step's all-to-all seconds and step time.
int worker(int steps, const std::vector<std::string>& overrides) {
  loom::comm::configure_worker_threads();
  const fs::path out = fs::temp_directory_path() / ("loom_bench_moe_" + std::to_string(getppid()));
  std::vector<std::string> all = overrides;
  all.push_back("run.output_dir=" + out.string());
  all.push_back("logging.trace_steps=[" + std::to_string(steps + 2) + "]");
  auto config = loom::parse_config(kModel, "bench", all);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.error().message.c_str());
    return 2;
  }
  auto trainer = loom::launch::create_trainer(*config);
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", trainer.error().message.c_str());
    return 1;
  }
  std::vector<double> times;
  double traced_s = 0;
  for (int i = 0; i <= steps + 1; ++i) {
    auto st = (*trainer)->step();
    if (!st.ok()) return 1;
    if (i == steps + 1)
      traced_s = st->step_time_s;
    else if (i > 0)
      times.push_back(st->step_time_s);
  }
  std::sort(times.begin(), times.end());
  std::printf("median_step_s %.6f\n", times[times.size() / 2]);
  if ((*trainer)->rank() == 0) {
    const fs::path trace = out / ("trace_step_" + std::to_string(steps + 2) + ".json");
    std::printf("a2a_s %.6f traced_s %.6f\n", all_to_all_seconds(trace), traced_s);
    fs::remove_all(out);
  }
  return 0;
}

double field(const std::vector<loom::launch::ProcessResult>& results, const char* name) {
  double worst = -1;
  for (const auto& r : results) {
    auto pos = r.output.find(std::string(name) + " ");
    if (!r.ok()) {
      std::fprintf(stderr, "a worker failed: %s\n", r.describe().c_str());
      std::exit(1);
    }
    if (pos != std::string::npos)
      worst = std::max(worst, std::stod(r.output.substr(pos + std::strlen(name) + 1)));
  }
  return worst;
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
  const int steps = quick ? 2 : 10, rounds = quick ? 1 : 3;
  char path[4096] = {0};
  if (readlink("/proc/self/exe", path, sizeof path - 1) <= 0) return 1;
  std::vector<double> ep, one, share;
  for (int round = 0; round < rounds; ++round) {
    auto ep_runs =
        loom::launch::spawn_workers(path, 2,
                                    {"--worker", std::to_string(steps), "parallel.dp=2",
                                     "parallel.ep=2", "comm.backend=gloo", "batch.micro=4"},
                                    600);
    ep.push_back(field(ep_runs, "median_step_s"));
    share.push_back(field(ep_runs, "a2a_s") / field(ep_runs, "traced_s"));
    loom::launch::Launch solo;
    solo.argv = {path, "--worker", std::to_string(steps), "batch.micro=8"};
    one.push_back(field(loom::launch::run_processes({solo}, 600), "median_step_s"));
  }
  const double e = median(ep), o = median(one);
  std::printf(
      "bench/moe: llama (4 layers, hidden 256, seq 64, 8 experts of 512, top 2), 16 samples per "
      "step in micro-batches of 8\n");
  std::printf("ep2 (dp 2, 2 processes, gloo)   %8.2f ms/step\n", e * 1e3);
  std::printf("one device (1 process)          %8.2f ms/step\n", o * 1e3);
  std::printf("ratio ep2 / one device          %8.3f\n", e / o);
  std::printf("all-to-all share of an ep2 step %8.1f %%\n", 100 * median(share));
  return 0;
}
