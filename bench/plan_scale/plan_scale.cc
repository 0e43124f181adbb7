// bench/plan_scale: the hybrid policy on gpt3-175b (96 layers) with dp x tp8 x pp8 at 512, 1024
// and 2048 virtual ranks. Each size runs in its own child process so its peak memory is its own.
// Prints time, peak memory, sub-operators, and the growth from one size to the next (linear
// growth doubles with the ranks). Target: 1024 ranks in <= 5 s and <= 2 GiB.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "models/model.h"
#include "plan/plan.h"

namespace {

struct Sample {
  double seconds = 0;
  double peak_mib = 0;
  long ops = 0;
};

// Runs in a child: builds and plans, writes the sample to `fd`.
void measure(int64_t ranks, int fd) {
  auto config = loom::parse_config(
      "model: {type: gpt, preset: gpt3-175b}\nparallel: {tp: 8, pp: 8}\nbatch: {global: 1024, "
      "micro: 1}\n",
      "bench", {"parallel.dp=" + std::to_string(ranks / 64)});
  if (!config.ok()) _exit(2);
  auto start = std::chrono::steady_clock::now();
  auto g = loom::plan::planned_graph(*config, loom::plan::Registries{}, ranks);
  Sample s;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!g.ok()) {
    std::fprintf(stderr, "%s\n", g.error().message.c_str());
    _exit(1);
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  s.peak_mib = static_cast<double>(usage.ru_maxrss) / 1024.0;
  s.ops = static_cast<long>(g->ops().size());
  if (write(fd, &s, sizeof s) != static_cast<ssize_t>(sizeof s)) _exit(1);
  _exit(0);
}

bool run(int64_t ranks, Sample& out) {
  int fds[2];
  if (pipe(fds) != 0) return false;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    measure(ranks, fds[1]);
  }
  close(fds[1]);
  ssize_t n = read(fds[0], &out, sizeof out);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return n == static_cast<ssize_t>(sizeof out) && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  std::vector<int64_t> sizes =
      quick ? std::vector<int64_t>{64, 128} : std::vector<int64_t>{512, 1024, 2048};
  std::printf("bench/plan_scale: gpt3-175b, hybrid dp x tp8 x pp8\n");
  Sample prev;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Sample s;
    if (!run(sizes[i], s)) {
      std::fprintf(stderr, "planning %lld ranks failed\n", static_cast<long long>(sizes[i]));
      return 1;
    }
    std::printf("%5lld ranks  %9ld sub-ops  %7.2f s  peak %8.1f MiB",
                static_cast<long long>(sizes[i]), s.ops, s.seconds, s.peak_mib);
    if (i > 0)
      std::printf("  growth x%.2f ranks -> time x%.2f, memory x%.2f",
                  static_cast<double>(sizes[i]) / static_cast<double>(sizes[i - 1]),
                  s.seconds / prev.seconds, s.peak_mib / prev.peak_mib);
    std::printf("\n");
    std::fflush(stdout);
    prev = s;
  }
  return 0;
}
