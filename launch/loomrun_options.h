#pragma once

#include <string>
#include <vector>

namespace loom::launch {

// Workers one loomrun starts at most, whatever the machine would allow: a node has a few hundred
// cores or GPUs at the very most, so a larger --nproc-per-node is a typo, not a job.
constexpr int kMaxWorkersPerNode = 4096;
// Open files loomrun keeps for itself besides the workers' (stdio, the master port's socket, a
// worker's pipe ends and /dev/null while it is being started).
constexpr long kReservedFiles = 16;

// What the machine lets one process start; -1 where there is no limit.
struct ProcessLimits {
  long open_files = -1;  // RLIMIT_NOFILE (ulimit -n): loomrun holds pipes and logs per worker
  long processes = -1;   // RLIMIT_NPROC (ulimit -u), or kernel.pid_max when that is lower
  static ProcessLimits of_this_process();
};

// What loomrun was asked to do; the parsed form of torchrun's flags.
struct RunOptions {
  int nproc_per_node = 1;                 // workers started on this node
  int nnodes = 1;                         // nodes in the job (fixed); MAX of MIN:MAX
  int nnodes_min = 1;                     // --nnodes MIN:MAX: fewest agents a round starts with
  int node_rank = 0;                      // this node's index, 0 .. nnodes-1
  std::string master_addr = "127.0.0.1";  // where rank 0's rendezvous listens
  int master_port = 29500;                // 0 asks loomrun to pick a free port
  bool standalone = false;                // one node, a free port on 127.0.0.1
  int max_restarts = 0;                   // group restarts after a failure
  std::string log_dir;                    // empty: workers' output only on the console
  bool tee = false;                       // with log_dir: console as well as the files (else no-op)
  std::string rdzv_token;                 // the job's secret (--rdzv-token); empty: see run()
  // Elastic rendezvous (--rdzv-endpoint): agents meet in loom's store at this address, hosted
  // by the agent that can bind it; node ranks then come from the join order.
  std::string rdzv_host;         // empty: no rendezvous, fixed --node-rank and --master-*
  int rdzv_port = 0;             // the store's port
  int rdzv_timeout_s = 600;      // a round without MIN agents by then fails the job
  int rdzv_last_call_s = 30;     // once MIN have joined, how long a round waits for more
  int heartbeat_timeout_s = 30;  // an agent silent this long is lost
  // --scale-up: an agent that joins while a round runs ends it (the workers are asked to stop,
  // which loom train does after a step and its checkpoint) and the next round admits it.
  bool scale_up = false;
  std::string program;            // the worker program (PATH is searched)
  std::vector<std::string> args;  // passed to the program untouched
};

inline bool is_elastic(const RunOptions& o) { return !o.rdzv_host.empty(); }

// Result of parsing: either options, a request for help, or one error line.
struct ParseResult {
  RunOptions options;
  bool help = false;
  std::string error;  // non-empty: a bad command line (exit 2)
};

// Parses argv (without argv[0]); options stop at the program name or "--", so the
// program's own flags are never read as loomrun's.
ParseResult parse_run_options(const std::vector<std::string>& argv);

// "" when o.nproc_per_node workers fit `limits`; else one line with the bound and the limit that
// sets it, so loomrun refuses before starting any instead of failing half-way.
std::string check_worker_count(const RunOptions& o, const ProcessLimits& limits);

// The job's secret the workers get as LOOM_RDZV_TOKEN: --rdzv-token, else `env_token` (loomrun's
// own LOOM_RDZV_TOKEN), else a fresh random one for a job on one node. A job on several nodes
// needs the same secret on each, so without one it is "" and `error` says what to set.
std::string rdzv_token(const RunOptions& o, const char* env_token, std::string* error);

// The usage text printed by --help.
std::string run_usage();

}  // namespace loom::launch
