// loomrun: starts nproc_per_node copies of a program with torchrun's environment, prefixes their
// output with the rank, and stops the whole group (printing the root cause) when one fails.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "core/secret.h"
#include "launch/loomrun_options.h"
#include "launch/rendezvous.h"

namespace loom::launch {
namespace {

using Clock = std::chrono::steady_clock;

// Time the workers get between SIGTERM and SIGKILL once the group is being stopped.
constexpr auto kGracePeriod = std::chrono::seconds(3);
// The same for a scale-up, where nothing failed: loom train finishes its step and writes its
// checkpoint before it exits.
constexpr auto kScaleUpGracePeriod = std::chrono::seconds(300);
// Stderr lines kept per worker for the root-cause report.
constexpr size_t kTailLines = 10;

volatile sig_atomic_t g_stop_signal = 0;

void on_stop_signal(int sig) { g_stop_signal = sig; }

int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// A worker's exit as the SIGCHLD handler reaped it, and when. The root cause is the rank whose
// exit came first; the main loop alone learns of exits late and several at once (while it
// drains output, or blocks on a full console), and then could only guess their order.
struct ReapedExit {
  pid_t pid;
  int status;
  int64_t at_ns;  // CLOCK_MONOTONIC
};
// Past this many unread exits the main loop reaps the rest itself (timed a little later).
constexpr int kMaxReapedExits = 8192;
static_assert(kMaxReapedExits >= kMaxWorkersPerNode, "every worker of an attempt is timed");
ReapedExit g_reaped[kMaxReapedExits];
volatile sig_atomic_t g_reaped_count = 0;  // written by the handler, reset with SIGCHLD blocked

// Reaps every exited child the moment SIGCHLD arrives (and interrupts poll()); only
// async-signal-safe calls.
void on_child(int) {
  const int saved_errno = errno;
  while (g_reaped_count < kMaxReapedExits) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    g_reaped[g_reaped_count] = {pid, status, monotonic_ns()};
    g_reaped_count = g_reaped_count + 1;
  }
  errno = saved_errno;
}

[[noreturn]] void die_usage(const std::string& message) {
  std::fprintf(stderr, "loomrun: %s\n", message.c_str());
  std::exit(2);
}

std::string signal_name(int sig) {
  static const struct {
    int sig;
    const char* name;
  } kNames[] = {{SIGKILL, "SIGKILL"}, {SIGTERM, "SIGTERM"}, {SIGINT, "SIGINT"},
                {SIGSEGV, "SIGSEGV"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},
                {SIGFPE, "SIGFPE"},   {SIGILL, "SIGILL"},   {SIGPIPE, "SIGPIPE"},
                {SIGHUP, "SIGHUP"},   {SIGQUIT, "SIGQUIT"}, {SIGUSR1, "SIGUSR1"},
                {SIGUSR2, "SIGUSR2"}};
  for (const auto& n : kNames)
    if (n.sig == sig) return n.name;
  return "signal " + std::to_string(sig);
}

// --- the master port --------------------------------------------------------------------------

bool resolve_ipv4(const std::string& host, sockaddr_in* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &addr->sin_addr) == 1) return true;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return false;
  addr->sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return true;
}

// Binds host:port (port 0: any free one) and returns the bound port, or -1 with errno set.
int try_bind(const sockaddr_in& base, int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // a TIME_WAIT port is free
  sockaddr_in addr = base;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  int bound = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    socklen_t len = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      bound = ntohs(addr.sin_port);
  }
  int saved = errno;
  close(fd);
  errno = saved;
  return bound;
}

// On node rank 0 the port must be bindable (or is picked); other nodes take it as given.
int settle_master_port(const RunOptions& o) {
  if (o.node_rank != 0 && o.master_port != 0) return o.master_port;
  if (o.node_rank != 0) die_usage("--master-port 0 only works on node rank 0; give rank 0's port");
  sockaddr_in addr;
  if (!resolve_ipv4(o.master_addr, &addr))
    die_usage("cannot resolve --master-addr " + o.master_addr);
  int port = try_bind(addr, o.master_port);
  if (port > 0) return port;
  if (o.master_port == 0)
    die_usage("cannot find a free port on " + o.master_addr + ": " + std::strerror(errno));
  if (errno == EADDRINUSE)
    die_usage("--master-port " + std::to_string(o.master_port) + " is in use on " + o.master_addr);
  die_usage("cannot bind --master-port " + std::to_string(o.master_port) + " on " + o.master_addr +
            ": " + std::strerror(errno));
}

// --- workers ----------------------------------------------------------------------------------

// One output stream of a worker (stdout or stderr) read through a pipe.
struct Stream {
  int fd = -1;          // read end; -1 once closed
  int console = -1;     // 1 or 2; -1 when the console gets nothing
  FILE* log = nullptr;  // the log file, when --log-dir is set
  std::string partial;  // bytes after the last newline
};

// One worker process of the current attempt.
struct Worker {
  int rank = 0;
  pid_t pid = -1;  // also its process group id
  bool running = false;
  int status = 0;                // waitpid status once reaped
  int64_t exited_ns = -1;        // CLOCK_MONOTONIC when it was reaped
  bool killed_by_group = false;  // still running when loomrun stopped the group
  Stream out, err;
  std::deque<std::string> err_tail;
};

bool make_dirs(const std::string& path) {
  std::string prefix;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || (path[i] == '/' && i > 0)) {
      prefix = path.substr(0, i);
      if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return false;
    }
  }
  return true;
}

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

void emit_line(Worker& w, Stream& s, const std::string& line) {
  if (s.console >= 0) write_all(s.console, "[rank " + std::to_string(w.rank) + "] " + line + "\n");
  if (s.log) {
    std::fputs(line.c_str(), s.log);
    std::fputc('\n', s.log);
    std::fflush(s.log);
  }
  if (&s == &w.err) {
    w.err_tail.push_back(line);
    if (w.err_tail.size() > kTailLines) w.err_tail.pop_front();
  }
}

// Reads what is available; at end of file flushes a last unterminated line and closes the pipe.
void drain(Worker& w, Stream& s) {
  char buf[4096];
  ssize_t n = read(s.fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    if (!s.partial.empty()) emit_line(w, s, s.partial);
    s.partial.clear();
    close(s.fd);
    s.fd = -1;
    return;
  }
  s.partial.append(buf, static_cast<size_t>(n));
  size_t start = 0, nl;
  while ((nl = s.partial.find('\n', start)) != std::string::npos) {
    emit_line(w, s, s.partial.substr(start, nl - start));
    start = nl + 1;
  }
  s.partial.erase(0, start);
}

struct WorkerEnv {
  int rank, local_rank, world_size, local_world_size, group_rank, master_port, attempt;
  std::string master_addr;
  std::string omp_threads;  // empty: leave OMP_NUM_THREADS as it is
  std::string rdzv_token;
};

// In the forked child: its own process group, the pipes as stdout/stderr, stdin from /dev/null (a
// background group reading the terminal would be stopped), and death with loomrun.
[[noreturn]] void exec_worker(const RunOptions& o, const WorkerEnv& e, pid_t parent, int out_fd,
                              int err_fd) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);  // loomrun is already gone
  int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd >= 0) dup2(null_fd, 0);
  dup2(out_fd, 1);
  dup2(err_fd, 2);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  signal(SIGPIPE, SIG_DFL);
  signal(SIGCHLD, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  auto set = [](const char* k, const std::string& v) { setenv(k, v.c_str(), 1); };
  set("RANK", std::to_string(e.rank));
  set("LOCAL_RANK", std::to_string(e.local_rank));
  set("WORLD_SIZE", std::to_string(e.world_size));
  set("LOCAL_WORLD_SIZE", std::to_string(e.local_world_size));
  set("GROUP_RANK", std::to_string(e.group_rank));
  set("MASTER_ADDR", e.master_addr);
  set("MASTER_PORT", std::to_string(e.master_port));
  set("LOOM_RESTART_COUNT", std::to_string(e.attempt));
  set(loom::kRdzvTokenEnv, e.rdzv_token);
  if (!e.omp_threads.empty()) set("OMP_NUM_THREADS", e.omp_threads);
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(o.program.c_str()));
  for (const auto& a : o.args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::fprintf(stderr, "loomrun: cannot run %s: %s\n", o.program.c_str(), std::strerror(errno));
  _exit(127);
}

FILE* open_log(const std::string& dir, const char* name) {
  std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "loomrun: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    std::exit(1);
  }
  return f;
}

// Starts one worker with its pipes; the console and log destinations follow --log-dir/--tee.
Worker start_worker(const RunOptions& o, const WorkerEnv& e) {
  Worker w;
  w.rank = e.rank;
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    std::fprintf(stderr, "loomrun: cannot create pipes: %s\n", std::strerror(errno));
    std::exit(1);
  }
  bool console = o.log_dir.empty() || o.tee;
  w.out.console = console ? 1 : -1;
  w.err.console = console ? 2 : -1;
  if (!o.log_dir.empty()) {
    std::string dir =
        o.log_dir + "/attempt_" + std::to_string(e.attempt) + "/" + std::to_string(e.rank);
    if (!make_dirs(dir)) {
      std::fprintf(stderr, "loomrun: cannot create %s: %s\n", dir.c_str(), std::strerror(errno));
      std::exit(1);
    }
    w.out.log = open_log(dir, "stdout.log");
    w.err.log = open_log(dir, "stderr.log");
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    std::fprintf(stderr, "loomrun: cannot fork: %s\n", std::strerror(errno));
    std::exit(1);
  }
  if (pid == 0) exec_worker(o, e, parent, out[1], err[1]);
  setpgid(pid, pid);  // also here, so the group exists before we might signal it
  close(out[1]);
  close(err[1]);
  w.pid = pid;
  w.running = true;
  w.out.fd = out[0];
  w.err.fd = err[0];
  return w;
}

void signal_all(std::vector<Worker>& ws, int sig) {
  for (auto& w : ws)
    if (w.running) killpg(w.pid, sig);
}

void record_exit(std::vector<Worker>& ws, pid_t pid, int status, int64_t at_ns) {
  for (auto& w : ws) {
    if (w.pid != pid || !w.running) continue;
    w.running = false;
    w.status = status;
    w.exited_ns = at_ns;
  }
}

// Takes over the exits the SIGCHLD handler reaped, then reaps (timed now) any it could not hold.
void reap(std::vector<Worker>& ws) {
  sigset_t chld, old;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, &old);  // the handler must not reap or append meanwhile
  for (int i = 0; i < g_reaped_count; ++i)
    record_exit(ws, g_reaped[i].pid, g_reaped[i].status, g_reaped[i].at_ns);
  g_reaped_count = 0;
  for (auto& w : ws) {
    int status = 0;
    if (w.running && waitpid(w.pid, &status, WNOHANG) == w.pid)
      record_exit(ws, w.pid, status, monotonic_ns());
  }
  sigprocmask(SIG_SETMASK, &old, nullptr);
}

// The index of the worker whose failure (non-zero exit or a signal) came first, -1 if none; by
// exit time, not by rank or by the order the main loop got to them.
int first_failure(const std::vector<Worker>& ws) {
  int first = -1;
  for (size_t i = 0; i < ws.size(); ++i) {
    const Worker& w = ws[i];
    const bool failed = !w.running && !(WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0);
    if (failed && (first < 0 || w.exited_ns < ws[static_cast<size_t>(first)].exited_ns))
      first = static_cast<int>(i);
  }
  return first;
}

bool any_open(const std::vector<Worker>& ws) {
  for (const auto& w : ws)
    if (w.running || w.out.fd >= 0 || w.err.fd >= 0) return true;
  return false;
}

void poll_output(std::vector<Worker>& ws, int timeout_ms) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Worker*, Stream*>> owners;
  for (auto& w : ws)
    for (Stream* s : {&w.out, &w.err})
      if (s->fd >= 0) {
        fds.push_back({s->fd, POLLIN, 0});
        owners.push_back({&w, s});
      }
  if (fds.empty()) {
    usleep(static_cast<useconds_t>(timeout_ms) * 1000);
    return;
  }
  if (poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
  for (size_t i = 0; i < fds.size(); ++i)
    if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) drain(*owners[i].first, *owners[i].second);
}

void close_stream(Worker& w, Stream& s) {
  if (s.fd >= 0) {
    if (!s.partial.empty()) emit_line(w, s, s.partial);
    close(s.fd);
    s.fd = -1;
  }
  if (s.log) std::fclose(s.log);
  s.log = nullptr;
}

// Whether the kernel holds `pid` stopped (SIGSTOP, SIGTSTP, a debugger): state T or t.
bool is_stopped(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return false;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* end = std::strrchr(buf, ')');  // the name may hold spaces and parentheses
  return end != nullptr && end[1] == ' ' && (end[2] == 'T' || end[2] == 't');
}

// The ranks named in "rank 3 did not arrive" / "ranks 1, 3 did not arrive" in `line`.
std::vector<int> ranks_not_arrived(const std::string& line) {
  std::vector<int> out;
  for (size_t at = line.find(" did not arrive"); at != std::string::npos;
       at = line.find(" did not arrive", at + 1)) {
    size_t start = line.rfind("rank", at);
    if (start == std::string::npos) continue;
    const char* p = line.c_str() + start + (line.compare(start, 5, "ranks") == 0 ? 5 : 4);
    while (p < line.c_str() + at) {
      char* end = nullptr;
      const long r = std::strtol(p, &end, 10);
      if (end == p) break;
      out.push_back(static_cast<int>(r));
      p = end;
      while (*p == ',' || *p == ' ') ++p;
    }
  }
  return out;
}

// The worker the others waited for when the first failure came: one the kernel held stopped,
// else the rank the failed workers' timeouts name most ("rank 2 did not arrive"), when it is
// not itself among the failed. -1 when there is none.
int hung_worker(const std::vector<Worker>& ws, const std::vector<bool>& stopped) {
  for (size_t i = 0; i < ws.size(); ++i)
    if (stopped[i]) return static_cast<int>(i);
  std::vector<int> votes(ws.size(), 0);
  for (const Worker& w : ws) {
    if (w.running || (WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0)) continue;
    std::vector<bool> named(ws.size(), false);
    for (const std::string& line : w.err_tail)
      for (int r : ranks_not_arrived(line))
        for (size_t i = 0; i < ws.size(); ++i)
          if (ws[i].rank == r && !named[i]) named[i] = true, ++votes[i];
  }
  int best = -1;
  for (size_t i = 0; i < ws.size(); ++i)
    if (votes[i] > 0 && (best < 0 || votes[i] > votes[static_cast<size_t>(best)]))
      best = static_cast<int>(i);
  if (best < 0) return -1;
  // A rank that failed on its own first is the cause, not one the others waited for.
  const Worker& b = ws[static_cast<size_t>(best)];
  const bool failed_itself =
      !b.running && !(WIFEXITED(b.status) && WEXITSTATUS(b.status) == 0) && !b.killed_by_group;
  return failed_itself ? -1 : best;
}

// How one attempt ended.
struct AttemptResult {
  int failed = -1;             // index of the first failed worker, -1 if none
  int hung = -1;               // index of the worker the others waited for, -1 if none
  bool hung_stopped = false;   // the kernel held it stopped
  int stop_signal = 0;         // SIGINT/SIGTERM received by loomrun, 0 if none
  std::string cause;           // what the watch said ended the attempt (elastic), "" if nothing
  bool local_failure = false;  // a worker of this node failed before anything else stopped it
};

// Where this node's workers sit in the world of one attempt.
struct Placement {
  int node_rank = 0;
  int nnodes = 1;
  std::string master_addr;
  int master_port = 0;
};

// Called on every turn of an attempt while it runs, with the index of the first failed worker
// (-1 if none): a non-empty answer stops the workers (the elastic rendezvous' verdict).
using Watch = std::function<std::string(const std::vector<Worker>& ws, int failed)>;

void start_workers(const RunOptions& o, const Placement& p, const std::string& token, int attempt,
                   std::vector<Worker>& ws) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  std::string omp;
  if (std::getenv("OMP_NUM_THREADS") == nullptr)
    omp = std::to_string(std::max(1L, cores / o.nproc_per_node));
  for (int local = 0; local < o.nproc_per_node; ++local) {
    WorkerEnv e{p.node_rank * o.nproc_per_node + local,
                local,
                p.nnodes * o.nproc_per_node,
                o.nproc_per_node,
                p.node_rank,
                p.master_port,
                attempt,
                p.master_addr,
                omp,
                token};
    ws.push_back(start_worker(o, e));
  }
}

// Runs one attempt to the end: all workers exited, or the group stopped after a failure, a
// signal or the watch's word.
AttemptResult run_attempt(const RunOptions& o, const Placement& p, const std::string& token,
                          int attempt, std::vector<Worker>& ws, const Watch& watch) {
  start_workers(o, p, token, attempt, ws);
  AttemptResult res;
  std::vector<bool> stopped(ws.size(), false);
  bool stopping = false;
  Clock::time_point kill_at{};
  bool killed = false;
  auto drain_until = Clock::time_point::max();
  while (any_open(ws)) {
    poll_output(ws, 50);
    reap(ws);
    res.failed = first_failure(ws);
    if (!stopping && watch) res.cause = watch(ws, res.failed);
    if (!stopping && (res.failed >= 0 || g_stop_signal != 0 || !res.cause.empty())) {
      stopping = true;
      res.stop_signal = g_stop_signal;
      res.local_failure = res.failed >= 0;
      for (size_t i = 0; i < ws.size(); ++i) {
        stopped[i] = ws[i].running && is_stopped(ws[i].pid);
        ws[i].killed_by_group = ws[i].running;
      }
      signal_all(ws, res.stop_signal != 0 ? res.stop_signal : SIGTERM);
      const bool healthy = res.failed < 0 && res.stop_signal == 0 && is_scale_up(res.cause);
      kill_at = Clock::now() + (healthy ? kScaleUpGracePeriod : kGracePeriod);
    }
    bool all_reaped = std::none_of(ws.begin(), ws.end(), [](const Worker& w) { return w.running; });
    if (stopping && !killed && (Clock::now() >= kill_at || all_reaped)) {
      // Also reaches whatever a worker left behind in its group.
      for (auto& w : ws) killpg(w.pid, SIGKILL);
      killed = true;
    }
    // A pipe held open by a process outside the group must not keep loomrun waiting forever.
    if (all_reaped && drain_until == Clock::time_point::max())
      drain_until = Clock::now() + std::chrono::seconds(stopping ? 1 : 5);
    if (Clock::now() >= drain_until) break;
  }
  for (auto& w : ws) {
    close_stream(w, w.out);
    close_stream(w, w.err);
  }
  if (res.failed >= 0) {
    res.hung = hung_worker(ws, stopped);
    res.hung_stopped = res.hung >= 0 && stopped[static_cast<size_t>(res.hung)];
  }
  return res;
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) return "signal " + signal_name(WTERMSIG(status));
  return "exit code " + std::to_string(WEXITSTATUS(status));
}

int exit_code_of(int status) {
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

// `effect`: another rank was the cause (report_hung), this one only failed first.
void report_root_cause(const Worker& w, int attempt, const RunOptions& o, bool effect) {
  std::string msg = std::string(effect ? "loomrun: " : "loomrun: root cause: ") + "rank " +
                    std::to_string(w.rank) + " (pid " + std::to_string(w.pid) + ") failed with " +
                    describe_status(w.status) + " on attempt " + std::to_string(attempt) + "\n";
  if (w.err_tail.empty()) {
    msg += "loomrun: rank " + std::to_string(w.rank) + " wrote nothing to stderr\n";
  } else {
    msg += "loomrun: last " + std::to_string(w.err_tail.size()) + " stderr lines of rank " +
           std::to_string(w.rank) + ":\n";
    for (const auto& line : w.err_tail) msg += "  | " + line + "\n";
  }
  if (!o.log_dir.empty())
    msg += "loomrun: full logs in " + o.log_dir + "/attempt_" + std::to_string(attempt) + "/" +
           std::to_string(w.rank) + "/\n";
  write_all(2, msg);
}

// The rank the others waited for is the cause; the first failure (reported next) is its effect.
void report_hung(const Worker& hung, bool stopped, const Worker& first, int attempt) {
  write_all(2, "loomrun: root cause: rank " + std::to_string(hung.rank) + " (pid " +
                   std::to_string(hung.pid) + ") stopped answering on attempt " +
                   std::to_string(attempt) +
                   (stopped ? " (the kernel held it stopped: SIGSTOP or a debugger)" : "") +
                   "; the other ranks timed out waiting for it, rank " +
                   std::to_string(first.rank) + " first:\n");
}

void install_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sa.sa_handler = on_child;
  sa.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed console must not kill the supervisor
}

// --- the elastic agent (--rdzv-endpoint) ----------------------------------------------------

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string this_agent() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  return std::string(host) + ":" + std::to_string(getpid());
}

// One round's start, and for a restart its cause and the time from the failure to this start.
void log_round(const Round& r, const RunOptions& o, const std::string& cause,
               Clock::time_point failed_at) {
  std::string line = "loomrun: round " + std::to_string(r.number) + ": " +
                     std::to_string(r.nnodes) + " node(s), world size " +
                     std::to_string(r.nnodes * o.nproc_per_node) + ", this agent is node " +
                     std::to_string(r.node_rank) + ", workers' store on " + r.master_addr + ":" +
                     std::to_string(r.master_port);
  if (r.number > 0 && !cause.empty()) {
    char took[32];
    std::snprintf(took, sizeof took, "%.1f", seconds_since(failed_at));
    line += "; restarted " + std::string(took) + " s after: " + cause;
  }
  write_all(2, line + "\n");
}

// What ended a round on this agent, as the rendezvous knows it.
struct RoundEnd {
  std::string cause;       // "" when every agent's workers succeeded
  std::string store_lost;  // the rendezvous store went away: the job cannot go on
  Clock::time_point at{};  // when this agent learned of the cause
  int exit_code = 1;       // this agent's exit if the job ends here
};

// Runs this agent's workers for one round and waits for the round's end.
RoundEnd run_round(const RunOptions& o, Rendezvous& rdzv, const Round& r,
                   const std::string& token) {
  RoundEnd end;
  const Watch watch = [&](const std::vector<Worker>& ws, int failed) -> std::string {
    Result<std::string> c = std::string();
    if (failed >= 0) {
      const Worker& w = ws[static_cast<size_t>(failed)];
      c = rdzv.fail("node " + std::to_string(r.node_rank) + " rank " + std::to_string(w.rank) +
                    " (pid " + std::to_string(w.pid) + ") failed with " +
                    describe_status(w.status));
    } else {
      c = rdzv.watch();
    }
    if (!c.ok()) end.store_lost = c.error().message;
    if (!c.ok()) return end.store_lost;
    if (!c->empty()) end.at = Clock::now();
    return *c;
  };
  std::vector<Worker> ws;
  const Placement p{r.node_rank, r.nnodes, r.master_addr, r.master_port};
  AttemptResult res = run_attempt(o, p, token, r.number, ws, watch);
  end.cause = res.cause;
  if (res.stop_signal != 0) {
    end.exit_code = 128 + res.stop_signal;
    Result<std::string> c = rdzv.fail("node " + std::to_string(r.node_rank) + " was stopped by " +
                                      signal_name(res.stop_signal));
    end.cause = c.ok() ? *c : c.error().message;
    return end;
  }
  if (res.local_failure) {
    const Worker& w = ws[static_cast<size_t>(res.failed)];
    report_root_cause(w, r.number, o, false);
    end.exit_code = exit_code_of(w.status);
  }
  if (end.cause.empty() && end.store_lost.empty()) {
    Result<std::string> f = rdzv.finish();
    if (!f.ok()) end.store_lost = f.error().message;
    if (f.ok()) end.cause = *f;
    end.at = Clock::now();
  }
  return end;
}

// One loomrun per node: rendezvous, run a round, and on a failure stop, re-rendezvous with the
// agents still alive and start the next round, while --max-restarts allow.
int run_elastic(const RunOptions& o, const std::string& token) {
  std::string not_hosting;
  const pid_t keeper = keep_store(o.rdzv_host, o.rdzv_port, token, &not_hosting);
  if (keeper < 0)
    die_usage("cannot start the rendezvous store: " + std::string(std::strerror(errno)));
  install_signals();
  Result<std::unique_ptr<RdzvClient>> client =
      RdzvClient::connect(o.rdzv_host, o.rdzv_port, token, std::chrono::seconds(o.rdzv_timeout_s));
  if (!client.ok()) {
    write_all(2,
              "loomrun: " + client.error().message + " (hosting it here: " + not_hosting + ")\n");
    return 1;
  }
  const RdzvSettings settings{o.nnodes_min,
                              o.nnodes,
                              std::chrono::seconds(o.rdzv_timeout_s),
                              std::chrono::seconds(o.rdzv_last_call_s),
                              std::chrono::seconds(o.heartbeat_timeout_s),
                              o.scale_up};
  Rendezvous rdzv(std::move(*client), settings, this_agent());
  RoundEnd last;
  int restarts = 0;  // rounds that ended in a failure; a scale-up is none
  while (true) {
    Result<Round> round = rdzv.join();
    if (!round.ok()) {
      write_all(2, "loomrun: " + round.error().message + "\n");
      // Fewer agents than --nnodes' MIN: the command line asked for a world that is not there.
      if (round.error().key == "--nnodes") return 2;
      return round.error().key == kJobOver ? 0 : 1;
    }
    log_round(*round, o, last.cause, last.at);
    last = run_round(o, rdzv, *round, token);
    if (!last.store_lost.empty()) {
      write_all(2, "loomrun: " + last.store_lost +
                       "; the agent hosting --rdzv-endpoint must outlive the job\n");
      return 1;
    }
    if (last.cause.empty()) {
      rdzv.leave("succeeded", keeper > 0);
      return 0;
    }
    if (g_stop_signal == 0 && is_scale_up(last.cause)) {
      write_all(2, "loomrun: round " + std::to_string(round->number) + " ended for a " +
                       last.cause + " (not counted against --max-restarts)\n");
      if (Status s = rdzv.advance(); !s.ok()) {
        write_all(2, "loomrun: " + s.error().message + "\n");
        return 1;
      }
      continue;
    }
    if (g_stop_signal != 0 || restarts >= o.max_restarts) {
      write_all(2, "loomrun: round " + std::to_string(round->number) + " failed: " + last.cause +
                       (g_stop_signal != 0
                            ? ""
                            : "; giving up after " + std::to_string(o.max_restarts) + " restarts") +
                       "\n");
      rdzv.leave("failed: " + last.cause, keeper > 0);
      return last.exit_code;
    }
    write_all(2, "loomrun: round " + std::to_string(round->number) + " failed: " + last.cause +
                     "; restarting (restart " + std::to_string(++restarts) + " of " +
                     std::to_string(o.max_restarts) + ")\n");
    if (Status s = rdzv.advance(); !s.ok()) {
      write_all(2, "loomrun: " + s.error().message + "\n");
      return 1;
    }
  }
}

int run(const RunOptions& o) {
  std::string error;
  const std::string token = rdzv_token(o, std::getenv(loom::kRdzvTokenEnv), &error);
  if (token.empty()) die_usage(error);
  // A log folder that cannot be made is the user's to fix, found before any worker starts.
  if (!o.log_dir.empty()) {
    const std::string probe = o.log_dir + "/attempt_0";
    if (!make_dirs(probe) || access(probe.c_str(), W_OK) != 0)
      die_usage("--log-dir " + o.log_dir + ": cannot create or write " + probe + ": " +
                std::strerror(errno));
  }
  if (is_elastic(o)) return run_elastic(o, token);
  const Placement fixed{o.node_rank, o.nnodes, o.master_addr, settle_master_port(o)};
  install_signals();
  for (int attempt = 0;; ++attempt) {
    std::vector<Worker> ws;
    AttemptResult res = run_attempt(o, fixed, token, attempt, ws, nullptr);
    if (res.stop_signal != 0) {
      std::fprintf(stderr, "loomrun: stopped the workers on %s\n",
                   signal_name(res.stop_signal).c_str());
      return 128 + res.stop_signal;
    }
    if (res.failed < 0) return 0;
    const Worker& w = ws[static_cast<size_t>(res.failed)];
    const bool hung = res.hung >= 0 && res.hung != res.failed;
    if (hung) report_hung(ws[static_cast<size_t>(res.hung)], res.hung_stopped, w, attempt);
    report_root_cause(w, attempt, o, hung);
    if (attempt >= o.max_restarts) {
      if (o.max_restarts > 0)
        std::fprintf(stderr, "loomrun: giving up after %d restarts\n", o.max_restarts);
      return exit_code_of(w.status);
    }
    std::fprintf(stderr, "loomrun: restarting the workers (restart %d of %d)\n", attempt + 1,
                 o.max_restarts);
  }
}

}  // namespace
}  // namespace loom::launch

int main(int argc, char** argv) {
  using namespace loom::launch;
  ParseResult parsed = parse_run_options(std::vector<std::string>(argv + 1, argv + argc));
  if (parsed.help) {
    std::fputs(run_usage().c_str(), stdout);
    return 0;
  }
  if (!parsed.error.empty()) die_usage(parsed.error);
  const std::string too_many = check_worker_count(parsed.options, ProcessLimits::of_this_process());
  if (!too_many.empty()) die_usage(too_many);
  return run(parsed.options);
}
