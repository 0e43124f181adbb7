// A worker for loomrun's tests. Modes (argv[1]):
//   env             print PID and the launcher's environment as KEY=VALUE lines
//   exit CODE RANK  rank RANK writes to stderr and exits CODE; the others print PID and sleep
//   stubborn RANK   like exit 1 RANK, but the sleeping ranks ignore SIGTERM
//   sigkill RANK    rank RANK kills itself with SIGKILL; the others print PID and sleep
//   flaky           rank 0 fails on attempt 0 (LOOM_RESTART_COUNT), everyone succeeds after
//   args ...        print each argument as ARG<i>=<arg>
//   lines           print two stdout lines and one stderr line
//   hang RANK HOW   rank RANK stops answering (HOW: stop = SIGSTOPs itself, spin = sleeps);
//                   the others wait 0.5 s, then fail as a collective's timeout does, naming it
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

std::string env(const char* key) {
  const char* v = std::getenv(key);
  return v ? v : "";
}

[[noreturn]] void sleep_forever() {
  std::printf("PID=%d\n", static_cast<int>(getpid()));
  std::fflush(stdout);
  for (int i = 0; i < 600; ++i) sleep(1);  // bounded even if nobody stops it
  std::exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string mode = argc > 1 ? argv[1] : "";
  int rank = std::atoi(env("RANK").c_str());
  if (mode == "env") {
    std::printf("PID=%d\n", static_cast<int>(getpid()));
    for (const char* k :
         {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
          "MASTER_PORT", "OMP_NUM_THREADS", "LOOM_RESTART_COUNT", "LOOM_RDZV_TOKEN"})
      std::printf("%s=%s\n", k, env(k).c_str());
    return 0;
  }
  if (mode == "exit" && argc == 4) {
    if (rank != std::atoi(argv[3])) sleep_forever();
    usleep(200 * 1000);  // let the siblings start and print their pids
    for (int i = 0; i < 15; ++i) std::fprintf(stderr, "error line %d\n", i);
    return std::atoi(argv[2]);
  }
  if (mode == "stubborn" && argc == 3) {
    if (rank != std::atoi(argv[2])) {
      signal(SIGTERM, SIG_IGN);
      sleep_forever();
    }
    usleep(200 * 1000);
    return 1;
  }
  if (mode == "sigkill" && argc == 3) {
    if (rank != std::atoi(argv[2])) sleep_forever();
    usleep(200 * 1000);
    std::fprintf(stderr, "about to die\n");
    raise(SIGKILL);
  }
  if (mode == "flaky") {
    if (rank == 0 && env("LOOM_RESTART_COUNT") == "0") {
      std::fprintf(stderr, "first attempt fails\n");
      return 1;
    }
    std::printf("ok on attempt %s\n", env("LOOM_RESTART_COUNT").c_str());
    return 0;
  }
  if (mode == "hang" && argc == 4) {
    const int hung = std::atoi(argv[2]);
    if (rank == hung) {
      std::printf("PID=%d\n", static_cast<int>(getpid()));
      std::fflush(stdout);
      if (std::strcmp(argv[3], "stop") == 0) raise(SIGSTOP);
      for (int i = 0; i < 600; ++i) sleep(1);
      return 0;
    }
    usleep((500 + 100 * rank) * 1000);
    std::fprintf(stderr,
                 "all_reduce #1 on group world timed out after 0.5 s: rank %d did not arrive\n",
                 hung);
    return 1;
  }
  if (mode == "args") {
    for (int i = 2; i < argc; ++i) std::printf("ARG%d=%s\n", i - 2, argv[i]);
    return 0;
  }
  if (mode == "lines") {
    std::printf("hello from %d\nsecond line\n", rank);
    std::fprintf(stderr, "warning from %d\n", rank);
    return 0;
  }
  std::fprintf(stderr, "launch_test_worker: unknown mode '%s'\n", mode.c_str());
  return 64;
}
