// Starts worker processes (fork + exec) with their own environment, collects exit status and
// output, and kills every one of them when a deadline passes, so a hanging rank fails its test
// or benchmark instead of hanging it. The multi-process tests and benchmarks run ranks with it.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace loom::launch {

struct Launch {
  std::vector<std::string> argv;           // argv[0] is the executable's path
  std::map<std::string, std::string> env;  // added to (and overriding) this process's env
};

struct ProcessResult {
  int exit_code = -1;   // when it exited
  int signal = 0;       // when a signal ended it
  bool killed = false;  // ended by the deadline
  double elapsed_s = 0;
  std::string output;  // stdout and stderr, interleaved

  bool ok() const { return exit_code == 0; }
  // "exit 1", "killed by signal 9", "killed at the deadline", then the output.
  std::string describe() const;
};

// Starts every launch at once and waits for all; at `deadline_s` kills the rest (and their
// process groups, so mpirun's children go too).
std::vector<ProcessResult> run_processes(const std::vector<Launch>& launches, double deadline_s);

// The path of `name` on PATH, or "" when it is not installed.
std::string find_program(const std::string& name);

// mpirun's arguments for running as root on a test machine with fewer cores than ranks (and in
// containers that forbid shared memory's cross-memory attach), before -np.
std::vector<std::string> mpirun_argv();

// A TCP port that was free a moment ago on 127.0.0.1.
int free_port();

// `world_size` copies of `worker args...` with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR=127.0.0.1, MASTER_PORT=<free port> and a LOOM_RDZV_TOKEN (unless `env` sets one),
// as loomrun would start them.
std::vector<ProcessResult> spawn_workers(const std::string& worker, int world_size,
                                         const std::vector<std::string>& args, double deadline_s,
                                         const std::map<std::string, std::string>& env = {});

// All results as one text for assertion messages.
std::string describe(const std::vector<ProcessResult>& results);

}  // namespace loom::launch
