// bench/tensorboard: what logging.tensorboard costs a training step. A GPT tiny Trainer (the
// smallest step, so the largest share) takes steps; after every other one, the step's six
// scalars are written as one event (serialised, framed, handed to the operating system at most
// once a second) by the writer `loom train` uses. Printed per round: the mean write time (each
// flush shared out over the writes between) against the median step time (the overhead's
// share), and the median of steps followed by a write against those without (the same share
// seen through step-to-step noise). A round is long enough (about 2 s) to hold its flushes.
// Target: under 1 %.
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/config.h"
#include "launch/planned_trainer.h"
#include "observe/event_file.h"
#include "runtime/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int rounds = quick ? 1 : 5, steps = quick ? 6 : 300;
  auto config = loom::parse_config(
      "run: {seed: 1, steps: 100000}\nmodel: {type: gpt, preset: tiny}\n"
      "batch: {global: 8, micro: 8}\noptimizer: {type: adamw, lr: 0.0003}\n",
      "bench");
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.error().message.c_str());
    return 2;
  }
  auto trainer = loom::launch::create_trainer(*config);
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", trainer.error().message.c_str());
    return 2;
  }
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "loom_bench_tensorboard";
  std::filesystem::remove_all(dir);
  auto writer = loom::observe::EventFileWriter::open(dir.string());
  if (!writer.ok()) {
    std::fprintf(stderr, "%s\n", writer.error().message.c_str());
    return 2;
  }
  std::printf(
      "bench/tensorboard: logging.tensorboard's cost per step, gpt tiny (b8 s32), %d "
      "threads, events in %s\n",
      at::get_num_threads(), dir.c_str());
  (void)(*trainer)->step();  // warm-up
  std::vector<double> shares;
  for (int round = 0; round < rounds; ++round) {
    std::vector<double> write_s, with_s, without_s;
    for (int i = 0; i < steps; ++i) {
      auto t0 = Clock::now();
      auto st = (*trainer)->step();
      if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.error().message.c_str());
        return 1;
      }
      if (i % 2 == 0) {
        auto w0 = Clock::now();
        const double wall =
            std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                .count();
        auto s = (*writer)->write_scalars(st->step,
                                          {{"loss", st->loss},
                                           {"lr", st->lr},
                                           {"grad_norm", st->grad_norm},
                                           {"step_time_s", st->step_time_s},
                                           {"tokens_per_s", st->tokens_per_s},
                                           {"peak_mem_bytes", st->peak_mem_bytes}},
                                          wall);
        if (!s.ok()) return 1;
        write_s.push_back(seconds_since(w0));
        with_s.push_back(seconds_since(t0));
      } else {
        without_s.push_back(seconds_since(t0));
      }
    }
    const double w = mean(write_s), step = median(without_s);
    shares.push_back(w / step);
    std::printf(
        "round %d: write (mean) %7.1f us  step %7.3f ms  write/step %.4f%%  "
        "steps with/without a write %.4f\n",
        round + 1, w * 1e6, step * 1e3, 100 * w / step, median(with_s) / step);
    std::fflush(stdout);
  }
  std::printf("median over %d rounds: logging.tensorboard costs %.4f%% of a step\n", rounds,
              100 * median(shares));
  std::filesystem::remove_all(dir);
  return 0;
}
