// loomrun's elastic rendezvous end to end: several real loomrun agents on this machine meet at
// a free loopback port; their workers are small shell programs that append their environment
// to a file. Every wait polls with a deadline; agents run in their own process groups, so that a
// test can kill one agent with its workers, as losing a node would.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

const std::string kLoomrun = std::string(LOOM_BINARY_DIR) + "/bin/loomrun";

std::string temp_dir() {
  char tmpl[] = "/tmp/loomrun_elastic_XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  return tmpl;
}

// A port that was free a moment ago on 127.0.0.1.
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

bool accepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> out;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Polls `done` every 20 ms until it holds or `seconds` pass.
template <class F>
bool eventually(F done, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    usleep(20 * 1000);
  }
  return true;
}

// One loomrun agent in its own process group, its stderr in DIR/NAME.err, run in DIR.
struct Agent {
  pid_t pid = -1;
  std::string err;
  int code = -1;  // exit code, 128 + signal, -1 while running

  // Waits up to `seconds` for the agent's exit; past it kills its group and fails the test.
  int wait(double seconds) {
    int status = 0;
    const bool ended = eventually([&] { return waitpid(pid, &status, WNOHANG) == pid; }, seconds);
    if (!ended) {
      ADD_FAILURE() << "the agent did not finish within " << seconds << " s; stderr:\n"
                    << read_file(err);
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
    code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return code;
  }
  std::string stderr_text() const { return read_file(err); }
};

Agent start_agent(const std::string& dir, const std::string& name,
                  const std::vector<std::string>& args) {
  Agent a;
  a.err = dir + "/" + name + ".err";
  a.pid = fork();
  if (a.pid == 0) {
    setpgid(0, 0);
    if (chdir(dir.c_str()) != 0) _exit(126);
    const int err = open(a.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int out = open((dir + "/" + name + ".out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(err, 2);
    setenv("LOOM_RDZV_TOKEN", "elastic-test-secret", 1);
    std::vector<char*> argv{const_cast<char*>(kLoomrun.c_str())};
    for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  setpgid(a.pid, a.pid);
  return a;
}

// The agent flags of a test job: short timeouts so that losses are seen in seconds.
std::vector<std::string> agent_args(const std::string& nnodes, int port, const std::string& worker,
                                    std::vector<std::string> extra = {}) {
  std::vector<std::string> a{"--nnodes",
                             nnodes,
                             "--nproc-per-node",
                             "2",
                             "--rdzv-endpoint",
                             "127.0.0.1:" + std::to_string(port),
                             "--rdzv-timeout",
                             "10",
                             "--rdzv-last-call",
                             "1",
                             "--heartbeat-timeout",
                             "2"};
  a.insert(a.end(), extra.begin(), extra.end());
  for (const char* s : {"sh", "-c"}) a.push_back(s);
  a.push_back(worker);
  return a;
}

// Each worker appends "RANK WORLD_SIZE LOOM_RESTART_COUNT GROUP_RANK" to env.txt.
const std::string kRecord =
    "echo \"$RANK $WORLD_SIZE $LOOM_RESTART_COUNT $GROUP_RANK\" >> env.txt; ";

TEST(LoomrunElastic, TwoAgentsMakeAWorldOfTwiceNproc) {
  const std::string dir = temp_dir();
  const int port = free_port();
  Agent a = start_agent(dir, "a", agent_args("2:2", port, kRecord));
  Agent b = start_agent(dir, "b", agent_args("2:2", port, kRecord));
  EXPECT_EQ(a.wait(30), 0) << a.stderr_text();
  EXPECT_EQ(b.wait(30), 0) << b.stderr_text();
  std::set<std::string> got;
  for (const std::string& l : lines_of(dir + "/env.txt")) got.insert(l);
  // Node ranks are the join order, whichever agent that was.
  EXPECT_EQ(got, (std::set<std::string>{"0 4 0 0", "1 4 0 0", "2 4 0 1", "3 4 0 1"}));
  EXPECT_NE(a.stderr_text().find("world size 4"), std::string::npos) << a.stderr_text();
}

TEST(LoomrunElastic, SurvivorRestartsWithHalfTheWorldWhenAnAgentIsKilled) {
  const std::string dir = temp_dir();
  const int port = free_port();
  // Round 0 runs until the test kills an agent; round 1 (the restart) ends at once.
  const std::string worker = kRecord + "[ \"$LOOM_RESTART_COUNT\" = 0 ] && exec sleep 60; exit 0";
  const auto args = agent_args("1:2", port, worker, {"--max-restarts", "1"});
  Agent host = start_agent(dir, "host", args);
  // The first agent hosts the store; the second joins it, so it is the one that may be lost.
  ASSERT_TRUE(eventually([&] { return accepts(port); }, 10)) << host.stderr_text();
  Agent other = start_agent(dir, "other", args);
  ASSERT_TRUE(eventually([&] { return lines_of(dir + "/env.txt").size() == 4; }, 20))
      << host.stderr_text() << other.stderr_text();
  ASSERT_EQ(kill(-other.pid, SIGKILL), 0);  // the agent and its workers, as a lost node
  EXPECT_EQ(other.wait(10), 128 + SIGKILL);
  EXPECT_EQ(host.wait(30), 0) << host.stderr_text();
  const std::vector<std::string> lines = lines_of(dir + "/env.txt");
  ASSERT_EQ(lines.size(), 6u) << host.stderr_text();
  const std::set<std::string> restarted(lines.begin() + 4, lines.end());
  EXPECT_EQ(restarted, (std::set<std::string>{"0 2 1 0", "1 2 1 0"}));
  const std::string log = host.stderr_text();
  EXPECT_NE(log.find("was lost: no heartbeat for 2 s"), std::string::npos) << log;
  EXPECT_NE(log.find("round 1: 1 node(s), world size 2"), std::string::npos) << log;
  EXPECT_NE(log.find("s after: node "), std::string::npos) << log;
}

TEST(LoomrunElastic, AFailedWorkerRestartsEveryAgent) {
  const std::string dir = temp_dir();
  const int port = free_port();
  const std::string worker = kRecord +
                             "[ \"$LOOM_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 3 ] && exit 3; "
                             "[ \"$LOOM_RESTART_COUNT\" = 0 ] && exec sleep 60; exit 0";
  const auto args = agent_args("2:2", port, worker, {"--max-restarts", "1"});
  Agent a = start_agent(dir, "a", args);
  Agent b = start_agent(dir, "b", args);
  EXPECT_EQ(a.wait(30), 0) << a.stderr_text();
  EXPECT_EQ(b.wait(30), 0) << b.stderr_text();
  int round1 = 0;
  for (const std::string& l : lines_of(dir + "/env.txt"))
    round1 += l.find(" 4 1 ") != std::string::npos;
  EXPECT_EQ(round1, 4);
  const std::string log = a.stderr_text() + b.stderr_text();
  EXPECT_NE(log.find("rank 3 (pid"), std::string::npos) << log;
  EXPECT_NE(log.find("failed with exit code 3; restarting (restart 1 of 1)"), std::string::npos)
      << log;
}

TEST(LoomrunElastic, TooFewAgentsWithinTheTimeoutExitNamingHowMany) {
  const std::string dir = temp_dir();
  const int port = free_port();
  std::vector<std::string> args = agent_args("2:3", port, kRecord);
  args[7] = "1";  // --rdzv-timeout
  Agent a = start_agent(dir, "a", args);
  EXPECT_EQ(a.wait(15), 1);
  const std::string err = a.stderr_text();
  EXPECT_NE(err.find("1 agent(s) joined round 0 within --rdzv-timeout 1 s; --nnodes needs at "
                     "least 2"),
            std::string::npos)
      << err;
}

TEST(LoomrunElastic, BadFlagsExitTwoNamingThem) {
  const std::string dir = temp_dir();
  const struct {
    std::vector<std::string> args;
    std::string names;
  } kCases[] = {
      {{"--nnodes", "3:2", "--rdzv-endpoint", "127.0.0.1:1"}, "--nnodes 3:2: MIN 3 exceeds MAX 2"},
      {{"--nnodes", "0:2", "--rdzv-endpoint", "127.0.0.1:1"},
       "--nnodes 0:2: MIN must be at least 1"},
      {{"--nnodes", "1:x", "--rdzv-endpoint", "127.0.0.1:1"}, "--nnodes expects N or MIN:MAX"},
      {{"--nnodes", "1:2"}, "--nnodes 1:2 needs --rdzv-endpoint"},
      {{"--rdzv-endpoint", "127.0.0.1"}, "--rdzv-endpoint expects HOST:PORT"},
      {{"--rdzv-endpoint", "h:70000"}, "--rdzv-endpoint expects HOST:PORT"},
      {{"--rdzv-timeout", "5"}, "--rdzv-timeout only applies with --rdzv-endpoint"},
      {{"--rdzv-timeout", "0", "--rdzv-endpoint", "h:1"}, "--rdzv-timeout expects seconds"},
      {{"--rdzv-endpoint", "h:1", "--node-rank", "1"}, "--node-rank is set by the rendezvous"},
      {{"--rdzv-endpoint", "h:1", "--master-port", "5"}, "--master-port is set by the rendezvous"},
      {{"--rdzv-endpoint", "h:1", "--standalone"}, "--standalone runs one node"},
  };
  for (const auto& c : kCases) {
    std::vector<std::string> args = c.args;
    args.push_back("true");
    Agent a = start_agent(dir, "bad", args);
    EXPECT_EQ(a.wait(10), 2) << c.names;
    EXPECT_NE(a.stderr_text().find(c.names), std::string::npos)
        << "expected '" << c.names << "' in: " << a.stderr_text();
  }
}

}  // namespace
