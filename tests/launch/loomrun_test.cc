// loomrun end to end: the real binary launches launch_test_worker; every wait is bounded.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace loom::launch {
namespace {

const std::string kLoomrun = std::string(LOOM_BINARY_DIR) + "/bin/loomrun";
const std::string kWorker = std::string(LOOM_BINARY_DIR) + "/bin/launch_test_worker";

struct Outcome {
  int code = -1;  // exit code, or 128+signal
  std::string out, err;
  double seconds = 0;
};

// Runs loomrun with args; kills it (and fails the test) past timeout_s. With hold_stdout_until,
// loomrun's stdout is left unread, a console that does not keep up, until that file has existed
// for 300 ms.
Outcome run_loomrun(const std::vector<std::string>& args, int timeout_s = 15,
                    const std::string& hold_stdout_until = "") {
  int out[2], err[2];
  EXPECT_EQ(pipe(out), 0);
  EXPECT_EQ(pipe(err), 0);
  auto start = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    close(out[0]);
    close(err[0]);
    std::vector<char*> argv{const_cast<char*>(kLoomrun.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  Outcome o;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* sinks[2] = {&o.out, &o.err};
  auto deadline = start + std::chrono::seconds(timeout_s);
  int open = 2;
  auto released_at = std::chrono::steady_clock::time_point::max();
  while (open > 0 && std::chrono::steady_clock::now() < deadline) {
    struct stat st;
    if (released_at == std::chrono::steady_clock::time_point::max() &&
        (hold_stdout_until.empty() || stat(hold_stdout_until.c_str(), &st) == 0))
      released_at = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(hold_stdout_until.empty() ? 0 : 300);
    fds[0].events = std::chrono::steady_clock::now() >= released_at ? POLLIN : 0;
    if (poll(fds, 2, 100) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      }
    }
  }
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      ADD_FAILURE() << "loomrun did not finish within " << timeout_s << " s";
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    usleep(10 * 1000);
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

std::vector<std::string> with_worker(std::vector<std::string> flags,
                                     const std::vector<std::string>& worker_args) {
  flags.push_back(kWorker);
  flags.insert(flags.end(), worker_args.begin(), worker_args.end());
  return flags;
}

// "[rank R] KEY=VALUE" lines of stdout, per rank.
std::map<int, std::map<std::string, std::string>> env_by_rank(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> m;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    int rank = -1;
    char rest[512] = {0};
    if (std::sscanf(line.c_str(), "[rank %d] %511[^\n]", &rank, rest) != 2) continue;
    std::string kv = rest;
    auto eq = kv.find('=');
    if (eq != std::string::npos) m[rank][kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return m;
}

std::vector<pid_t> printed_pids(const std::string& out) {
  std::vector<pid_t> pids;
  for (const auto& [rank, kv] : env_by_rank(out))
    if (kv.count("PID")) pids.push_back(static_cast<pid_t>(std::atoi(kv.at("PID").c_str())));
  return pids;
}

bool is_dir(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string temp_dir() {
  char tmpl[] = "/tmp/loomrun_test_XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  return tmpl;
}

TEST(Loomrun, EnvContractForThreeWorkers) {
  unsetenv("OMP_NUM_THREADS");
  Outcome o = run_loomrun(with_worker({"--nproc-per-node", "3", "--master-port", "0"}, {"env"}));
  ASSERT_EQ(o.code, 0) << o.err;
  auto env = env_by_rank(o.out);
  ASSERT_EQ(env.size(), 3u) << o.out;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  for (int r = 0; r < 3; ++r) {
    auto& e = env[r];
    EXPECT_EQ(e["RANK"], std::to_string(r));
    EXPECT_EQ(e["LOCAL_RANK"], std::to_string(r));
    EXPECT_EQ(e["WORLD_SIZE"], "3");
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(e["GROUP_RANK"], "0");
    EXPECT_EQ(e["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(e["LOOM_RESTART_COUNT"], "0");
    EXPECT_EQ(e["OMP_NUM_THREADS"], std::to_string(std::max(1L, cores / 3)));
    EXPECT_GT(std::atoi(e["MASTER_PORT"].c_str()), 0);
    EXPECT_EQ(e["MASTER_PORT"], env[0]["MASTER_PORT"]);
    // One secret per job, the same for its workers: 128 random bits.
    EXPECT_EQ(e["LOOM_RDZV_TOKEN"].size(), 32u);
    EXPECT_EQ(e["LOOM_RDZV_TOKEN"], env[0]["LOOM_RDZV_TOKEN"]);
  }
  Outcome again = run_loomrun(with_worker({"--standalone"}, {"env"}));
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(env_by_rank(again.out)[0]["LOOM_RDZV_TOKEN"], env[0]["LOOM_RDZV_TOKEN"]);
}

// Several nodes share a secret the user sets once (flag or environment); without one loomrun
// refuses, since each node would make its own and no rank could join rank 0.
TEST(Loomrun, NodesShareTheSecretTheUserSets) {
  Outcome flag =
      run_loomrun(with_worker({"--standalone", "--rdzv-token", "from-the-flag"}, {"env"}));
  ASSERT_EQ(flag.code, 0) << flag.err;
  EXPECT_EQ(env_by_rank(flag.out)[0]["LOOM_RDZV_TOKEN"], "from-the-flag");
  setenv("LOOM_RDZV_TOKEN", "from-the-env", 1);
  Outcome from_env = run_loomrun(with_worker({"--standalone"}, {"env"}));
  unsetenv("LOOM_RDZV_TOKEN");
  ASSERT_EQ(from_env.code, 0) << from_env.err;
  EXPECT_EQ(env_by_rank(from_env.out)[0]["LOOM_RDZV_TOKEN"], "from-the-env");
  Outcome none = run_loomrun(with_worker(
      {"--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.2.3", "--master-port", "29611"},
      {"env"}));
  EXPECT_EQ(none.code, 2) << none.err;
  EXPECT_NE(none.err.find("--nnodes 2 needs the job's secret, the same on every node: set "
                          "LOOM_RDZV_TOKEN (or --rdzv-token)"),
            std::string::npos)
      << none.err;
}

TEST(Loomrun, KeepsAnOmpNumThreadsAlreadySet) {
  setenv("OMP_NUM_THREADS", "7", 1);
  Outcome o = run_loomrun(with_worker({"--nproc_per_node=2", "--master_port=0"}, {"env"}));
  unsetenv("OMP_NUM_THREADS");
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(env_by_rank(o.out)[1]["OMP_NUM_THREADS"], "7");
}

TEST(Loomrun, SecondNodeRankArithmetic) {
  Outcome o = run_loomrun(
      with_worker({"--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-addr",
                   "10.1.2.3", "--master-port", "29611", "--rdzv-token", "shared"},
                  {"env"}));
  ASSERT_EQ(o.code, 0) << o.err;
  auto env = env_by_rank(o.out);
  ASSERT_EQ(env.size(), 2u) << o.out;
  for (int local = 0; local < 2; ++local) {
    auto& e = env[2 + local];
    EXPECT_EQ(e["RANK"], std::to_string(2 + local));
    EXPECT_EQ(e["LOCAL_RANK"], std::to_string(local));
    EXPECT_EQ(e["WORLD_SIZE"], "4");
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(e["GROUP_RANK"], "1");
    EXPECT_EQ(e["MASTER_ADDR"], "10.1.2.3");
    EXPECT_EQ(e["MASTER_PORT"], "29611");
  }
}

TEST(Loomrun, PrefixesEachLineWithTheRank) {
  Outcome o = run_loomrun(with_worker({"--nproc-per-node", "2", "--standalone"}, {"lines"}));
  ASSERT_EQ(o.code, 0) << o.err;
  for (int r = 0; r < 2; ++r) {
    std::string p = "[rank " + std::to_string(r) + "] ";
    EXPECT_NE(o.out.find(p + "hello from " + std::to_string(r) + "\n"), std::string::npos) << o.out;
    EXPECT_NE(o.out.find(p + "second line\n"), std::string::npos) << o.out;
    EXPECT_NE(o.err.find(p + "warning from " + std::to_string(r) + "\n"), std::string::npos)
        << o.err;
  }
  EXPECT_EQ(o.out.find("warning"), std::string::npos);
}

TEST(Loomrun, FailingWorkerStopsTheGroupAndIsTheRootCause) {
  Outcome o =
      run_loomrun(with_worker({"--nproc-per-node", "3", "--standalone"}, {"exit", "3", "1"}));
  EXPECT_EQ(o.code, 3) << o.err;
  EXPECT_LT(o.seconds, 10.0);
  EXPECT_NE(o.err.find("root cause: rank 1"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("exit code 3"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("  | error line 14"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("  | error line 5"), std::string::npos) << o.err;
  EXPECT_EQ(o.err.find("  | error line 4\n"), std::string::npos) << o.err;  // only the last 10
  auto pids = printed_pids(o.out);
  EXPECT_EQ(pids.size(), 2u) << o.out;
  for (pid_t pid : pids) {
    errno = 0;
    EXPECT_EQ(kill(pid, 0), -1) << "worker " << pid << " still alive";
    EXPECT_EQ(errno, ESRCH);
  }
}

// Two ranks fail 0.3 s apart, the first with the real error, the second with what its peer's
// death did to it, while loomrun is blocked writing a third rank's flood of output to a console
// that does not read it. loomrun learns of both exits at once when the console reads again; the
// root cause is the rank that exited first, whichever of the two it is, not the lower rank.
TEST(Loomrun, RootCauseIsTheRankThatExitedFirstNotTheLowest) {
  for (int first : {1, 0}) {
    const std::string dir = temp_dir();
    const std::string script =
        "case $RANK in\n"
        "  2) yes 'a line of output nobody reads yet' | head -c 1000000; exec sleep 30;;\n"
        "  " +
        std::to_string(first) + ") sleep 0.5; echo 'the real error' >&2; : > " + dir +
        "/first; exit 3;;\n"
        "  *) while [ ! -e " +
        dir +
        "/first ]; do sleep 0.02; done; sleep 0.3\n"
        "     echo 'Connection closed by peer' >&2; : > " +
        dir +
        "/second; exit 1;;\n"
        "esac\n";
    Outcome o = run_loomrun({"--nproc-per-node", "3", "--standalone", "sh", "-c", script}, 30,
                            dir + "/second");
    EXPECT_EQ(o.code, 3) << o.err;
    EXPECT_NE(o.err.find("root cause: rank " + std::to_string(first) + " "), std::string::npos)
        << "rank " << first << " exited first:\n"
        << o.err;
    EXPECT_NE(o.err.find("  | the real error"), std::string::npos) << o.err;
    EXPECT_EQ(o.err.find("  | Connection closed by peer"), std::string::npos) << o.err;
    EXPECT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
  }
}

// A rank that stops answering makes the others time out naming it; the first of those to exit
// is not the cause: loomrun names the rank they waited for, stopped by SIGSTOP or not.
TEST(Loomrun, AHungRankIsTheRootCauseNotTheFirstToTimeOut) {
  for (const char* how : {"stop", "spin"}) {
    Outcome o =
        run_loomrun(with_worker({"--nproc-per-node", "3", "--standalone"}, {"hang", "2", how}), 30);
    EXPECT_EQ(o.code, 1) << o.err;
    EXPECT_NE(o.err.find("loomrun: root cause: rank 2 "), std::string::npos) << how << o.err;
    EXPECT_NE(o.err.find("stopped answering"), std::string::npos) << o.err;
    EXPECT_EQ(o.err.find("root cause: rank 0"), std::string::npos) << o.err;
    EXPECT_EQ(o.err.find("(the kernel held it stopped") != std::string::npos,
              std::string(how) == "stop")
        << o.err;
    EXPECT_NE(o.err.find("loomrun: rank 0 (pid"), std::string::npos) << o.err;  // first to fail
  }
}

TEST(Loomrun, WorkersIgnoringSigtermAreKilledAfterTheGrace) {
  Outcome o =
      run_loomrun(with_worker({"--nproc-per-node", "2", "--standalone"}, {"stubborn", "0"}));
  EXPECT_EQ(o.code, 1) << o.err;
  EXPECT_GE(o.seconds, 2.5);  // SIGTERM first, SIGKILL after the 3 s grace
  EXPECT_LT(o.seconds, 10.0);
  auto pids = printed_pids(o.out);
  ASSERT_EQ(pids.size(), 1u) << o.out;
  EXPECT_EQ(kill(pids[0], 0), -1) << "worker " << pids[0] << " still alive";
}

TEST(Loomrun, WorkerKilledBySignalIsNamed) {
  Outcome o = run_loomrun(with_worker({"--nproc-per-node", "2", "--standalone"}, {"sigkill", "0"}));
  EXPECT_EQ(o.code, 128 + SIGKILL) << o.err;
  EXPECT_NE(o.err.find("root cause: rank 0"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("SIGKILL"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("  | about to die"), std::string::npos) << o.err;
}

TEST(Loomrun, MaxRestartsRestartsTheGroup) {
  std::string dir = temp_dir();
  Outcome o = run_loomrun(with_worker(
      {"--nproc-per-node", "2", "--standalone", "--max-restarts", "1", "--log-dir", dir, "--tee"},
      {"flaky"}));
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.err.find("restarting"), std::string::npos) << o.err;
  EXPECT_NE(o.out.find("[rank 0] ok on attempt 1"), std::string::npos) << o.out;
  for (const char* a : {"attempt_0", "attempt_1"})
    for (const char* r : {"0", "1"}) EXPECT_TRUE(is_dir(dir + "/" + a + "/" + r)) << a << "/" << r;
  EXPECT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
}

TEST(Loomrun, AllAttemptsFailingExitsNonZero) {
  Outcome o = run_loomrun(with_worker({"--standalone", "--max-restarts", "2"}, {"exit", "5", "0"}));
  EXPECT_EQ(o.code, 5) << o.err;
  EXPECT_NE(o.err.find("on attempt 2"), std::string::npos) << o.err;
}

TEST(Loomrun, LogDirWithoutTeeKeepsOutputInFilesOnly) {
  std::string dir = temp_dir();
  Outcome o = run_loomrun(
      with_worker({"--nproc-per-node", "2", "--standalone", "--log-dir", dir}, {"lines"}));
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out.find("hello"), std::string::npos) << o.out;
  FILE* f = std::fopen((dir + "/attempt_0/1/stdout.log").c_str(), "r");
  ASSERT_NE(f, nullptr);
  char buf[256] = {0};
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  EXPECT_EQ(std::string(buf, n), "hello from 1\nsecond line\n");
  EXPECT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
}

TEST(Loomrun, BusyMasterPortIsRefused) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::string port = std::to_string(ntohs(addr.sin_port));
  Outcome o = run_loomrun(with_worker({"--master-port", port}, {"env"}));
  close(fd);
  EXPECT_EQ(o.code, 2);
  EXPECT_EQ(o.err, "loomrun: --master-port " + port + " is in use on 127.0.0.1\n");
  EXPECT_EQ(o.out, "");  // nothing was started
}

TEST(Loomrun, ArgumentsPassThroughUntouched) {
  Outcome o = run_loomrun(with_worker({"--standalone"}, {"args", "two words", "it's \"quoted\"",
                                                         "$HOME", "--nproc-per-node", "*"}));
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out,
            "[rank 0] ARG0=two words\n[rank 0] ARG1=it's \"quoted\"\n[rank 0] ARG2=$HOME\n"
            "[rank 0] ARG3=--nproc-per-node\n[rank 0] ARG4=*\n");
}

TEST(Loomrun, BadCommandLinesExitTwoWithOneLine) {
  const std::vector<std::vector<std::string>> bad = {
      {"--bogus", kWorker},
      {"--nproc-per-node", "2"},
      {"--nproc-per-node", "0", kWorker},
      {"--nproc-per-node", "x", kWorker},
      {"--nproc-per-node", "100000", kWorker},
      {"--nnodes", "1048576", "--nproc-per-node", "4096", kWorker},
      {"--max-restarts", "5000", kWorker},
      {"--nnodes", "2", "--node-rank", "2", kWorker},
      {"--master-port", "70000", kWorker},
      {"--master-port", "-1", kWorker},
      {"--nproc-per-node"},
      {"--standalone", "--master-port", "29500", kWorker},
      {"--master-addr", "10.0.0.1", "--standalone", kWorker},
      {"--rdzv-token", "", kWorker},
      {"--log-dir", "/proc/loom_no_such_dir", kWorker},
  };
  for (const auto& args : bad) {
    Outcome o = run_loomrun(args);
    EXPECT_EQ(o.code, 2) << args[0];
    ASSERT_FALSE(o.err.empty()) << args[0];
    EXPECT_EQ(o.err.rfind("loomrun: ", 0), 0u) << o.err;
    EXPECT_EQ(o.err.find('\n'), o.err.size() - 1) << o.err;  // exactly one line
    EXPECT_EQ(o.out, "");
  }
}

// A loomrun whose two workers sleep, with their pids once both have printed them.
struct Sleepers {
  pid_t loomrun = -1;
  std::vector<pid_t> workers;
};

Sleepers start_sleepers() {
  int out[2];
  EXPECT_EQ(pipe(out), 0);
  Sleepers s;
  s.loomrun = fork();
  if (s.loomrun == 0) {
    dup2(out[1], 1);
    close(out[0]);
    execl(kLoomrun.c_str(), kLoomrun.c_str(), "--nproc-per-node", "2", "--standalone",
          kWorker.c_str(), "exit", "1", "9", static_cast<char*>(nullptr));  // rank 9: both sleep
    _exit(127);
  }
  close(out[1]);
  std::string text;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (printed_pids(text).size() < 2 && std::chrono::steady_clock::now() < deadline) {
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[512];
    ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  s.workers = printed_pids(text);
  return s;
}

// Waits (bounded) for loomrun to exit; returns its wait status, or kills it and returns -1.
int wait_bounded(pid_t pid, int timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    usleep(10 * 1000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

// Gone, or a zombie waiting for whoever inherited it.
bool gone(pid_t pid) {
  if (kill(pid, 0) != 0) return true;
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return true;
  char buf[512] = {0};
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  std::string stat(buf, n);
  auto paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

bool all_gone_within(const std::vector<pid_t>& pids, int timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::all_of(pids.begin(), pids.end(), gone)) return true;
    usleep(10 * 1000);
  }
  return false;
}

// loomrun under a shell's `ulimit`: exit code and everything it printed.
std::pair<int, std::string> loomrun_under(const std::string& ulimit, const std::string& args) {
  const std::string cmd =
      "bash -c 'ulimit " + ulimit + " && exec " + kLoomrun + " " + args + "' 2>&1 </dev/null";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

// More workers than loomrun or the machine can run is refused before any starts, with the
// bound and what sets it: loomrun's own (a node's workers), the open-file limit (two pipes per
// worker, four with --log-dir), the process limit.
TEST(Loomrun, TooManyWorkersIsRefusedNamingTheBoundAndWhy) {
  Outcome huge = run_loomrun(with_worker({"--nproc-per-node", "100000"}, {"env"}));
  EXPECT_EQ(huge.code, 2) << huge.err;
  EXPECT_NE(huge.err.find("--nproc-per-node 100000 is more workers than one node runs: at most "
                          "4096 (a node has a few hundred cores or GPUs at the most)"),
            std::string::npos)
      << huge.err;
  EXPECT_EQ(huge.err.find("positive integer"), std::string::npos) << huge.err;

  auto files = loomrun_under("-n 64", "--nproc-per-node 40 " + kWorker + " env");
  EXPECT_EQ(files.first, 2) << files.second;
  EXPECT_NE(files.second.find("--nproc-per-node 40 needs 96 open files (2 per worker) but the "
                              "open-file limit (ulimit -n) is 64: at most 24 workers"),
            std::string::npos)
      << files.second;
  EXPECT_EQ(files.second.find("PID="), std::string::npos) << "a worker started";
  auto logs = loomrun_under("-n 64",
                            "--nproc-per-node 20 --log-dir /tmp/loomrun_never " + kWorker + " env");
  EXPECT_EQ(logs.first, 2) << logs.second;
  EXPECT_NE(logs.second.find("(4 per worker with --log-dir)"), std::string::npos) << logs.second;
  // At the bound they all start.
  auto fits = loomrun_under("-n 64", "--nproc-per-node 24 --master-port 0 " + kWorker + " env");
  EXPECT_EQ(fits.first, 0) << fits.second;

  auto processes = loomrun_under("-u 10", "--nproc-per-node 12 " + kWorker + " env");
  EXPECT_EQ(processes.first, 2) << processes.second;
  EXPECT_NE(processes.second.find("--nproc-per-node 12 needs 13 processes (the workers and "
                                  "loomrun) but the process limit (ulimit -u, or "
                                  "kernel.pid_max) is 10: at most 9 workers"),
            std::string::npos)
      << processes.second;
}

TEST(Loomrun, SigintIsForwardedAndExits130) {
  Sleepers s = start_sleepers();
  ASSERT_EQ(s.workers.size(), 2u);
  kill(s.loomrun, SIGINT);
  int status = wait_bounded(s.loomrun, 10);
  ASSERT_NE(status, -1) << "loomrun did not stop on SIGINT";
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  for (pid_t w : s.workers) EXPECT_TRUE(gone(w)) << "worker " << w << " still alive";
}

TEST(Loomrun, SigtermIsForwardedAndExits143) {
  Sleepers s = start_sleepers();
  ASSERT_EQ(s.workers.size(), 2u);
  kill(s.loomrun, SIGTERM);
  int status = wait_bounded(s.loomrun, 10);
  ASSERT_NE(status, -1) << "loomrun did not stop on SIGTERM";
  EXPECT_EQ(WEXITSTATUS(status), 143);
  for (pid_t w : s.workers) EXPECT_TRUE(gone(w)) << "worker " << w << " still alive";
}

TEST(Loomrun, WorkersDieWithAKilledLoomrun) {
  Sleepers s = start_sleepers();
  ASSERT_EQ(s.workers.size(), 2u);
  kill(s.loomrun, SIGKILL);
  EXPECT_NE(wait_bounded(s.loomrun, 10), -1);
  EXPECT_TRUE(all_gone_within(s.workers, 5));
}

}  // namespace
}  // namespace loom::launch
