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

#include "tests/support/loomrun_agents.h"

namespace {

using namespace loom::testing_support;  // NOLINT: the agents of these tests

// The agent flags of a test job: short timeouts so that losses are seen in seconds (5 s of
// silence: a loomrun on a machine busy with the rest of the suite still answers well within it).
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
                             "5"};
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
  EXPECT_NE(log.find("was lost: no heartbeat for 5 s"), std::string::npos) << log;
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

// With --scale-up, an agent that joins while a round runs ends it: the workers get SIGTERM (and
// may finish their step), and the next round admits the newcomer without counting a restart.
TEST(LoomrunElastic, AnAgentJoiningMidRunIsAdmittedWithScaleUp) {
  const std::string dir = temp_dir();
  const int port = free_port();
  // Round 0's workers run until they are asked to stop, and exit as loom train does then.
  const std::string worker =
      kRecord +
      "[ \"$LOOM_RESTART_COUNT\" = 0 ] && { trap 'exit 143' TERM; sleep 60 & wait; }; exit 0";
  const auto args = agent_args("1:2", port, worker, {"--scale-up"});
  Agent host = start_agent(dir, "host", args);
  ASSERT_TRUE(eventually([&] { return lines_of(dir + "/env.txt").size() == 2; }, 20))
      << host.stderr_text();
  Agent late = start_agent(dir, "late", args);
  EXPECT_EQ(host.wait(30), 0) << host.stderr_text();
  EXPECT_EQ(late.wait(30), 0) << late.stderr_text();
  const std::vector<std::string> lines = lines_of(dir + "/env.txt");
  ASSERT_EQ(lines.size(), 6u) << host.stderr_text();
  EXPECT_EQ(std::set<std::string>(lines.begin(), lines.begin() + 2),
            (std::set<std::string>{"0 2 0 0", "1 2 0 0"}));
  EXPECT_EQ(std::set<std::string>(lines.begin() + 2, lines.end()),
            (std::set<std::string>{"0 4 1 0", "1 4 1 0", "2 4 1 1", "3 4 1 1"}));
  const std::string log = host.stderr_text();
  EXPECT_NE(log.find("ended for a scale-up: agent "), std::string::npos) << log;
  EXPECT_NE(log.find("(not counted against --max-restarts)"), std::string::npos) << log;
  EXPECT_NE(log.find("round 1: 2 node(s), world size 4"), std::string::npos) << log;
}

// A MIN the agents never reach is a bad --nnodes: exit 2 naming it.
TEST(LoomrunElastic, TooFewAgentsWithinTheTimeoutExitNamingHowMany) {
  const std::string dir = temp_dir();
  const int port = free_port();
  std::vector<std::string> args = agent_args("2:3", port, kRecord);
  args[7] = "1";  // --rdzv-timeout
  Agent a = start_agent(dir, "a", args);
  EXPECT_EQ(a.wait(15), 2);
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
      {{"--scale-up"}, "--scale-up only applies with --rdzv-endpoint"},
      {{"--nnodes", "2", "--rdzv-endpoint", "h:1", "--scale-up"},
       "--scale-up needs room to grow: --nnodes 2 is fixed"},
      {{"--scale-up=1", "--rdzv-endpoint", "h:1"}, "--scale-up takes no value"},
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
