// bench/plan_dump: `loom plan` (plan, lower, check, write every rank's program and the summary)
// for gpt3-175b under dp x tp8 x pp8 at 256, 1024 and 4096 virtual ranks; wall time and peak
// memory of each run (its own process) with plan.json and without it (--no-plan-json, the
// baseline in the same run), and the growth from one size to the next. 8
// micro-batches per step. Target: 1024 ranks in <= 10 s.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const std::vector<long> sizes =
      quick ? std::vector<long>{64} : std::vector<long>{256, 1024, 4096};
  const std::string loom = std::string(LOOM_BINARY_DIR) + "/bin/loom";
  const std::string config = std::string(LOOM_BINARY_DIR) + "/bench_plan_dump.yaml";
  std::FILE* f = std::fopen(config.c_str(), "w");
  std::fputs("model: {type: gpt, preset: gpt3-175b}\nparallel: {tp: 8, pp: 8}\nbatch: {micro: 1}\n",
             f);
  std::fclose(f);
  std::printf("bench/plan_dump: loom plan, gpt3-175b, dp x tp8 x pp8\n");
  // One `loom plan` in its own process: wall seconds and peak resident MiB, or a negative time.
  auto measure = [&](long ranks, bool plan_json, double* mib) {
    const std::string out =
        std::filesystem::temp_directory_path() / ("loom_plan_dump_" + std::to_string(ranks));
    std::filesystem::remove_all(out);
    const std::string dp = "parallel.dp=" + std::to_string(ranks / 64);
    // 8 micro-batches per step on every data-parallel replica.
    const std::string global = "batch.global=" + std::to_string(ranks / 64 * 8);
    std::fflush(stdout);
    auto start = std::chrono::steady_clock::now();
    pid_t pid = fork();
    if (pid == 0) {
      std::freopen("/dev/null", "w", stdout);
      execl(loom.c_str(), loom.c_str(), "plan", config.c_str(), dp.c_str(), global.c_str(), "--out",
            out.c_str(), plan_json ? nullptr : "--no-plan-json", nullptr);
      _exit(127);
    }
    int status = 0;
    rusage usage{};
    wait4(pid, &status, 0, &usage);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::filesystem::remove_all(out);
    *mib = static_cast<double>(usage.ru_maxrss) / 1024.0;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? seconds : -1.0;
  };
  double prev_t = 0, prev_m = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    double mib = 0, base_mib = 0;
    const double seconds = measure(sizes[i], true, &mib);
    const double base = measure(sizes[i], false, &base_mib);
    if (seconds < 0 || base < 0) {
      std::fprintf(stderr, "loom plan failed for %ld ranks\n", sizes[i]);
      return 1;
    }
    std::printf(
        "%5ld ranks  %7.2f s  peak %8.1f MiB  (without plan.json %6.2f s, %7.1f MiB: plan.json "
        "x%.2f time)",
        sizes[i], seconds, mib, base, base_mib, seconds / base);
    if (i > 0)
      std::printf("  growth x%.0f ranks -> time x%.2f, memory x%.2f",
                  static_cast<double>(sizes[i]) / static_cast<double>(sizes[i - 1]),
                  seconds / prev_t, mib / prev_m);
    std::printf("\n");
    std::fflush(stdout);
    prev_t = seconds;
    prev_m = mib;
  }
  return 0;
}
