#include "launch/loomrun_options.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "core/secret.h"

namespace loom::launch {
namespace {

// Accepts both torchrun spellings: --nproc_per_node and --nproc-per-node.
std::string normalize_flag(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

bool parse_long(const std::string& text, long lo, long hi, long* out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool parse_int(const std::string& text, long lo, long hi, int* out) {
  long v = 0;
  if (!parse_long(text, lo, hi, &v)) return false;
  *out = static_cast<int>(v);
  return true;
}

// --nproc-per-node: a positive integer, at most kMaxWorkersPerNode; the error names the bound.
std::string parse_nproc(const std::string& value, int* out) {
  long v = 0;
  const bool digits = !value.empty() && value.find_first_not_of("0123456789") == std::string::npos;
  if (!parse_long(value, 1, LONG_MAX, &v) && !(digits && errno == ERANGE))
    return "--nproc-per-node expects a positive integer, got '" + value + "'";
  if (errno == ERANGE || v > kMaxWorkersPerNode)
    return "--nproc-per-node " + value + " is more workers than one node runs: at most " +
           std::to_string(kMaxWorkersPerNode) +
           " (a node has a few hundred cores or GPUs at the most)";
  *out = static_cast<int>(v);
  return "";
}

// --nnodes N, or MIN:MAX for an elastic job (which --rdzv-endpoint must accompany).
std::string parse_nnodes(const std::string& value, RunOptions* o) {
  const size_t colon = value.find(':');
  const std::string lo = value.substr(0, colon);
  const std::string hi = colon == std::string::npos ? lo : value.substr(colon + 1);
  int min = 0, max = 0;
  if (!parse_int(lo, 0, 1 << 20, &min) || !parse_int(hi, 0, 1 << 20, &max))
    return "--nnodes expects N or MIN:MAX (integers 1.." + std::to_string(1 << 20) + "), got '" +
           value + "'";
  if (min < 1) return "--nnodes " + value + ": MIN must be at least 1";
  if (min > max)
    return "--nnodes " + value + ": MIN " + std::to_string(min) + " exceeds MAX " +
           std::to_string(max);
  o->nnodes_min = min;
  o->nnodes = max;
  return "";
}

// --rdzv-endpoint HOST:PORT (the last colon splits, so the host may be a name).
std::string parse_endpoint(const std::string& value, RunOptions* o) {
  const size_t colon = value.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !parse_int(value.substr(colon + 1), 1, 65535, &port))
    return "--rdzv-endpoint expects HOST:PORT with a port 1..65535, got '" + value + "'";
  o->rdzv_host = value.substr(0, colon);
  o->rdzv_port = port;
  return "";
}

// The flags that only an elastic job takes, and those it assigns itself, against the others.
std::string check_elastic(const RunOptions& o, const std::vector<std::string>& given) {
  auto has = [&](const char* f) { return std::find(given.begin(), given.end(), f) != given.end(); };
  if (!is_elastic(o)) {
    if (o.nnodes_min != o.nnodes)
      return "--nnodes " + std::to_string(o.nnodes_min) + ":" + std::to_string(o.nnodes) +
             " needs --rdzv-endpoint HOST:PORT, where the agents meet";
    for (const char* f : {"--rdzv-timeout", "--rdzv-last-call", "--heartbeat-timeout"})
      if (has(f)) return std::string(f) + " only applies with --rdzv-endpoint HOST:PORT";
    if (o.scale_up) return "--scale-up only applies with --rdzv-endpoint HOST:PORT";
    return "";
  }
  for (const char* f : {"--node-rank", "--master-addr", "--master-port"})
    if (has(f))
      return std::string(f) +
             " is set by the rendezvous with --rdzv-endpoint (node ranks in join order, rank 0's "
             "node hosts the workers' store); drop it";
  if (o.standalone) return "--standalone runs one node without a rendezvous; drop --rdzv-endpoint";
  if (o.scale_up && o.nnodes_min == o.nnodes)
    return "--scale-up needs room to grow: --nnodes " + std::to_string(o.nnodes) +
           " is fixed; give --nnodes MIN:MAX";
  return "";
}

std::string check(const RunOptions& o) {
  if (o.program.empty()) return "missing the program to run (loomrun [options] PROGRAM [ARGS...])";
  if (o.node_rank >= o.nnodes)
    return "--node-rank " + std::to_string(o.node_rank) + " must be less than --nnodes " +
           std::to_string(o.nnodes);
  if (o.standalone && o.nnodes != 1)
    return "--standalone runs one node; drop --nnodes or set it to 1";
  if (o.master_addr.empty()) return "--master-addr must not be empty";
  if (static_cast<long long>(o.nnodes) * o.nproc_per_node > INT_MAX)
    return "--nnodes " + std::to_string(o.nnodes) + " x --nproc-per-node " +
           std::to_string(o.nproc_per_node) + " ranks do not fit WORLD_SIZE (at most " +
           std::to_string(INT_MAX) + ")";
  return "";
}

long soft_limit(int resource) {
  rlimit l{};
  if (getrlimit(resource, &l) != 0 || l.rlim_cur == RLIM_INFINITY) return -1;
  return l.rlim_cur > static_cast<rlim_t>(LONG_MAX) ? -1 : static_cast<long>(l.rlim_cur);
}

// Sets the valued option `name` (a known one) from `value`; the error names the flag and range.
std::string set_option(const std::string& name, const std::string& value, RunOptions* o) {
  if (name == "--nproc-per-node") return parse_nproc(value, &o->nproc_per_node);
  if (name == "--nnodes") return parse_nnodes(value, o);
  if (name == "--rdzv-endpoint") return parse_endpoint(value, o);
  if (name == "--master-addr") {
    o->master_addr = value;
    return "";
  }
  if (name == "--log-dir") {
    o->log_dir = value;
    return "";
  }
  if (name == "--rdzv-token") {
    if (value.empty()) return "--rdzv-token must not be empty";
    o->rdzv_token = value;
    return "";
  }
  const struct {
    const char* name;
    long lo, hi;
    int RunOptions::*field;
  } kIntegers[] = {{"--rdzv-timeout", 1, 86400, &RunOptions::rdzv_timeout_s},
                   {"--rdzv-last-call", 0, 86400, &RunOptions::rdzv_last_call_s},
                   {"--heartbeat-timeout", 1, 3600, &RunOptions::heartbeat_timeout_s},
                   {"--node-rank", 0, (1 << 20) - 1, &RunOptions::node_rank},
                   {"--master-port", 0, 65535, &RunOptions::master_port},
                   {"--max-restarts", 0, 1000, &RunOptions::max_restarts}};
  for (const auto& f : kIntegers) {
    if (name != f.name) continue;
    if (parse_int(value, f.lo, f.hi, &(o->*f.field))) return "";
    const bool seconds = name.find("timeout") != std::string::npos || name == "--rdzv-last-call";
    return name + " expects " +
           (name == "--master-port" ? "a port"
            : seconds               ? "seconds"
                                    : "an integer") +
           " " + std::to_string(f.lo) + ".." + std::to_string(f.hi) + ", got '" + value + "'";
  }
  return "unknown option " + name;
}

}  // namespace

ProcessLimits ProcessLimits::of_this_process() {
  ProcessLimits l;
  l.open_files = soft_limit(RLIMIT_NOFILE);
  l.processes = soft_limit(RLIMIT_NPROC);
  long pid_max = -1;
  if (FILE* f = std::fopen("/proc/sys/kernel/pid_max", "r")) {
    if (std::fscanf(f, "%ld", &pid_max) != 1) pid_max = -1;
    std::fclose(f);
  }
  if (pid_max > 0 && (l.processes < 0 || pid_max < l.processes)) l.processes = pid_max;
  return l;
}

std::string check_worker_count(const RunOptions& o, const ProcessLimits& limits) {
  const long n = o.nproc_per_node;
  const std::string asked = "--nproc-per-node " + std::to_string(n);
  // Two pipes per worker (stdout, stderr) for its lifetime, and two log files with --log-dir.
  const long per_worker = o.log_dir.empty() ? 2 : 4;
  const long files = kReservedFiles + n * per_worker;
  if (limits.open_files >= 0 && files > limits.open_files)
    return asked + " needs " + std::to_string(files) + " open files (" +
           std::to_string(per_worker) + " per worker" +
           (o.log_dir.empty() ? "" : " with --log-dir") +
           ") but the open-file limit (ulimit -n) is " + std::to_string(limits.open_files) +
           ": at most " +
           std::to_string(std::max(0L, (limits.open_files - kReservedFiles) / per_worker)) +
           " workers; raise the limit or start fewer";
  if (limits.processes >= 0 && n + 1 > limits.processes)
    return asked + " needs " + std::to_string(n + 1) +
           " processes (the workers and loomrun) but the process limit (ulimit -u, or "
           "kernel.pid_max) is " +
           std::to_string(limits.processes) + ": at most " +
           std::to_string(std::max(0L, limits.processes - 1)) + " workers";
  return "";
}

std::string rdzv_token(const RunOptions& o, const char* env_token, std::string* error) {
  if (!o.rdzv_token.empty()) return o.rdzv_token;
  if (env_token != nullptr && env_token[0] != '\0') return env_token;
  if (o.nnodes == 1 && !is_elastic(o)) {
    std::string made = random_secret();
    if (made.empty()) *error = "cannot make the job's secret: the kernel gave no random bytes";
    return made;
  }
  *error =
      (is_elastic(o) ? std::string("--rdzv-endpoint") : "--nnodes " + std::to_string(o.nnodes)) +
      " needs the job's secret, the same on every node: set LOOM_RDZV_TOKEN (or "
      "--rdzv-token) on each, e.g. to the output of 'openssl rand -hex 16'";
  return "";
}

std::string run_usage() {
  return "usage: loomrun [options] PROGRAM [ARGS...]\n"
         "  --nproc-per-node N   workers on this node (default 1)\n"
         "  --nnodes N|MIN:MAX   nodes in the job (default 1); MIN:MAX is elastic and\n"
         "                       needs --rdzv-endpoint\n"
         "  --node-rank K        this node's rank, 0..nnodes-1 (default 0)\n"
         "  --master-addr HOST   rank 0's address (default 127.0.0.1)\n"
         "  --master-port P      rank 0's port, 0 picks a free one (default 29500)\n"
         "  --standalone         one node on 127.0.0.1 with a free port\n"
         "  --rdzv-token SECRET  the job's secret, the same on every node (or set\n"
         "                       LOOM_RDZV_TOKEN); one node makes its own\n"
         "  --max-restarts N     restart the whole group up to N times (default 0)\n"
         "  --rdzv-endpoint H:P  elastic: agents meet in a store on H:P, hosted by the agent\n"
         "                       that can bind it (it must outlive the job); node ranks in\n"
         "                       join order; lost agents are left out of the next round\n"
         "  --rdzv-timeout S     a round without MIN agents after S seconds fails (600)\n"
         "  --rdzv-last-call S   once MIN agents joined, wait S seconds for more (30)\n"
         "  --heartbeat-timeout S  an agent silent for S seconds is lost (30)\n"
         "  --scale-up           an agent joining while a round runs is admitted at once:\n"
         "                       the workers get SIGTERM (loom train stops after the step\n"
         "                       and its checkpoint) and the group restarts with it; such\n"
         "                       restarts do not count against --max-restarts\n"
         "  --log-dir DIR        keep DIR/attempt_K/RANK/{stdout,stderr}.log\n"
         "  --tee                with --log-dir, also print workers' output\n"
         "Underscore spellings (--nproc_per_node) are accepted too.\n";
}

ParseResult parse_run_options(const std::vector<std::string>& argv) {
  ParseResult r;
  RunOptions& o = r.options;
  std::string master_flag;         // --master-addr or --master-port when given
  std::vector<std::string> given;  // valued flags seen, normalized
  size_t i = 0;
  for (; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the program name
    if (arg == "-h" || arg == "--help") {
      r.help = true;
      return r;
    }
    std::string name = arg, value;
    bool has_value = false;
    size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    name = normalize_flag(name);
    if (name == "--standalone" || name == "--tee" || name == "--scale-up") {
      if (has_value) {
        r.error = name + " takes no value";
        return r;
      }
      (name == "--standalone" ? o.standalone : name == "--tee" ? o.tee : o.scale_up) = true;
      continue;
    }
    static const char* kValued[] = {"--nproc-per-node", "--nnodes",         "--node-rank",
                                    "--master-addr",    "--master-port",    "--max-restarts",
                                    "--log-dir",        "--rdzv-token",     "--rdzv-endpoint",
                                    "--rdzv-timeout",   "--rdzv-last-call", "--heartbeat-timeout"};
    if (std::find(std::begin(kValued), std::end(kValued), name) == std::end(kValued)) {
      r.error = "unknown option " + arg + " (see loomrun --help)";
      return r;
    }
    if (!has_value) {
      if (i + 1 >= argv.size()) {
        r.error = name + " needs a value";
        return r;
      }
      value = argv[++i];
    }
    r.error = set_option(name, value, &o);
    if (!r.error.empty()) return r;
    if (name == "--master-addr" || name == "--master-port") master_flag = name;
    given.push_back(name);
  }
  if (i < argv.size()) {
    o.program = argv[i];
    o.args.assign(argv.begin() + static_cast<long>(i) + 1, argv.end());
  }
  r.error = check_elastic(o, given);
  if (!r.error.empty()) return r;
  if (o.standalone && !master_flag.empty()) {
    r.error = "--standalone picks 127.0.0.1 and a free port itself; drop " + master_flag +
              " or --standalone";
    return r;
  }
  if (o.standalone) {
    o.master_addr = "127.0.0.1";
    o.master_port = 0;
  }
  r.error = check(o);
  return r;
}

}  // namespace loom::launch
