#include "launch/loomrun_options.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>

namespace loom::launch {
namespace {

// Accepts both torchrun spellings: --nproc_per_node and --nproc-per-node.
std::string normalize_flag(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

bool parse_int(const std::string& text, long lo, long hi, int* out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

std::string check(const RunOptions& o) {
  if (o.program.empty()) return "missing the program to run (loomrun [options] PROGRAM [ARGS...])";
  if (o.node_rank >= o.nnodes)
    return "--node-rank " + std::to_string(o.node_rank) + " must be less than --nnodes " +
           std::to_string(o.nnodes);
  if (o.standalone && o.nnodes != 1)
    return "--standalone runs one node; drop --nnodes or set it to 1";
  if (o.master_addr.empty()) return "--master-addr must not be empty";
  return "";
}

}  // namespace

std::string run_usage() {
  return "usage: loomrun [options] PROGRAM [ARGS...]\n"
         "  --nproc-per-node N   workers on this node (default 1)\n"
         "  --nnodes N           nodes in the job (default 1)\n"
         "  --node-rank K        this node's rank, 0..nnodes-1 (default 0)\n"
         "  --master-addr HOST   rank 0's address (default 127.0.0.1)\n"
         "  --master-port P      rank 0's port, 0 picks a free one (default 29500)\n"
         "  --standalone         one node on 127.0.0.1 with a free port\n"
         "  --max-restarts N     restart the whole group up to N times (default 0)\n"
         "  --log-dir DIR        keep DIR/attempt_K/RANK/{stdout,stderr}.log\n"
         "  --tee                with --log-dir, also print workers' output\n"
         "Underscore spellings (--nproc_per_node) are accepted too.\n";
}

ParseResult parse_run_options(const std::vector<std::string>& argv) {
  ParseResult r;
  RunOptions& o = r.options;
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
    if (name == "--standalone" || name == "--tee") {
      if (has_value) {
        r.error = name + " takes no value";
        return r;
      }
      (name == "--standalone" ? o.standalone : o.tee) = true;
      continue;
    }
    static const char* kValued[] = {"--nproc-per-node", "--nnodes",      "--node-rank",
                                    "--master-addr",    "--master-port", "--max-restarts",
                                    "--log-dir"};
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
    bool ok = true;
    if (name == "--nproc-per-node")
      ok = parse_int(value, 1, 4096, &o.nproc_per_node);
    else if (name == "--nnodes")
      ok = parse_int(value, 1, 1 << 20, &o.nnodes);
    else if (name == "--node-rank")
      ok = parse_int(value, 0, 1 << 20, &o.node_rank);
    else if (name == "--master-port")
      ok = parse_int(value, 0, 65535, &o.master_port);
    else if (name == "--max-restarts")
      ok = parse_int(value, 0, 1000, &o.max_restarts);
    else if (name == "--master-addr")
      o.master_addr = value;
    else if (name == "--log-dir")
      o.log_dir = value;
    if (!ok) {
      const char* what = name == "--master-port"      ? "a port 0..65535"
                         : name == "--nproc-per-node" ? "a positive integer"
                                                      : "a non-negative integer";
      r.error = name + " expects " + what + ", got '" + value + "'";
      return r;
    }
  }
  if (i < argv.size()) {
    o.program = argv[i];
    o.args.assign(argv.begin() + static_cast<long>(i) + 1, argv.end());
  }
  if (o.standalone) {
    o.master_addr = "127.0.0.1";
    o.master_port = 0;
  }
  r.error = check(o);
  return r;
}

}  // namespace loom::launch
