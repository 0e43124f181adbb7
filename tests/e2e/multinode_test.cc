// Two nodes on one machine: two network namespaces joined by a veth pair, `loomrun --nnodes 2`
// in each (one rank per node, gloo across the link), and the losses equal the single-node run
// of the same two ranks and the single-process run; and a stranger on the other side of the
// link (a wrong secret, none, a plain c10d TCPStore client) is refused by rank 0's store, which
// listens on the master address only, while the job runs. Skipped, with the reason, where network
// namespaces cannot be made (not root, no `ip`, a kernel or container that refuses them).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "launch/spawn.h"

namespace {

namespace fs = std::filesystem;

int sh(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<double> losses(const fs::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  std::vector<double> out;
  for (std::string line; std::getline(in, line);)
    out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

// Two namespaces and the veth pair between them; removed in every path (a namespace's
// deletion removes the veth end inside it, and with it the pair).
class TwoNodes {
 public:
  TwoNodes() {
    const std::string id = std::to_string(getpid());
    ns_ = {"loom_n0_" + id, "loom_n1_" + id};
    const std::string veth0 = "lv0_" + id, veth1 = "lv1_" + id;
    std::string log;
    if (sh("ip netns add " + ns_[0] + " > /dev/null 2>&1") != 0) {
      reason_ =
          "cannot create a network namespace here ('ip netns add' failed: needs root and a kernel "
          "with netns)";
      ns_.clear();
      return;
    }
    made_ = 1;
    const std::vector<std::string> steps = {
        "ip netns add " + ns_[1],
        "ip link add " + veth0 + " type veth peer name " + veth1,
        "ip link set " + veth0 + " netns " + ns_[0],
        "ip link set " + veth1 + " netns " + ns_[1],
        "ip -n " + ns_[0] + " addr add " + std::string(kAddr0) + "/24 dev " + veth0,
        "ip -n " + ns_[1] + " addr add " + std::string(kAddr1) + "/24 dev " + veth1,
        "ip -n " + ns_[0] + " link set " + veth0 + " up",
        "ip -n " + ns_[1] + " link set " + veth1 + " up",
        "ip -n " + ns_[0] + " link set lo up",
        "ip -n " + ns_[1] + " link set lo up",
    };
    for (size_t i = 0; i < steps.size(); ++i) {
      if (sh(steps[i] + " > /dev/null 2>&1") != 0) {
        reason_ = "cannot set up the veth pair: '" + steps[i] + "' failed";
        sh("ip link del " + veth0 + " > /dev/null 2>&1");
        return;
      }
      if (i == 0) made_ = 2;
    }
    ok_ = true;
  }
  ~TwoNodes() {
    for (int i = 0; i < made_; ++i)
      sh("ip netns del " + ns_[static_cast<size_t>(i)] + " > /dev/null 2>&1");
  }
  bool ok() const { return ok_; }
  const std::string& reason() const { return reason_; }
  std::string exec(int node) const {
    return "ip netns exec " + ns_[static_cast<size_t>(node)] + " ";
  }

  static constexpr const char* kAddr0 = "10.231.7.1";
  static constexpr const char* kAddr1 = "10.231.7.2";

 private:
  std::vector<std::string> ns_;
  int made_ = 0;
  bool ok_ = false;
  std::string reason_;
};

TEST(MultiNode, TwoNamespacesOverVethTrainLikeOneNode) {
  const fs::path dir =
      fs::path(testing::TempDir()) / ("loom_multinode_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string bin = std::string(LOOM_BINARY_DIR) + "/bin/";
  setenv("OMP_NUM_THREADS", "1", 1);  // every run, every rank: one intra-op thread
  std::ofstream(dir / "c.yaml") << "run: {steps: 4, seed: 5}\nmodel: {type: gpt, preset: tiny}\n"
                                   "batch: {global: 8, micro: 4}\noptimizer: {type: sgd, lr: 0.3}\n"
                                   "comm: {backend: gloo, timeout_s: 30}\n";
  auto train = [&](const std::string& run) {
    return bin + "loom train " + (dir / "c.yaml").string() +
           " parallel.tp=2 run.output_dir=" + (dir / run).string();
  };

  // The reference runs: one process, and two ranks on one node.
  ASSERT_EQ(sh("timeout 120 " + bin + "loom train " + (dir / "c.yaml").string() +
               " run.output_dir=" + (dir / "one").string() + " > " + (dir / "one.log").string() +
               " 2>&1"),
            0)
      << read(dir / "one.log");
  ASSERT_EQ(sh("timeout 120 " + bin + "loomrun --nproc-per-node 2 --standalone " + train("node1") +
               " > " + (dir / "node1.log").string() + " 2>&1"),
            0)
      << read(dir / "node1.log");

  TwoNodes nodes;
  if (!nodes.ok()) GTEST_SKIP() << nodes.reason();
  const int port = loom::launch::free_port();
  setenv("LOOM_RDZV_TOKEN", "two-nodes-secret", 1);  // the same on both nodes
  auto node = [&](int k) {
    return "timeout 120 " + nodes.exec(k) + bin + "loomrun --nnodes 2 --node-rank " +
           std::to_string(k) + " --nproc-per-node 1 --master-addr " + TwoNodes::kAddr0 +
           " --master-port " + std::to_string(port) + " " + train("nodes2") + " > " +
           (dir / ("node_rank" + std::to_string(k) + ".log")).string() + " 2>&1";
  };
  // Both nodes at once; each loomrun exits with its workers' status.
  const int code = sh("bash -c '(" + node(1) + ") & pid=$!; " + node(0) +
                      "; a=$?; wait $pid; b=$?; exit $((a + b))'");
  ASSERT_EQ(code, 0) << "node 0:\n"
                     << read(dir / "node_rank0.log") << "\nnode 1:\n"
                     << read(dir / "node_rank1.log");

  const auto one = losses(dir / "one"), single_node = losses(dir / "node1"),
             two_nodes = losses(dir / "nodes2");
  ASSERT_EQ(one.size(), 4u);
  ASSERT_EQ(single_node.size(), one.size());
  ASSERT_EQ(two_nodes.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_NEAR(two_nodes[i], single_node[i], 1e-6 * single_node[i]) << "step " << i + 1;
    EXPECT_NEAR(two_nodes[i], one[i], 1e-5 * one[i]) << "step " << i + 1;
  }
}

// Node 0 waits for node 1 while, from node 1's namespace, a stranger tries the store three
// ways and a plain connect to node 0's loopback finds nothing; then node 1 joins and the job runs.
TEST(MultiNode, AStrangerAcrossTheVethIsRefusedWhileTheJobRuns) {
  const fs::path dir = fs::path(testing::TempDir()) / ("loom_stranger_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string bin = std::string(LOOM_BINARY_DIR) + "/bin/";
  TwoNodes nodes;
  if (!nodes.ok()) GTEST_SKIP() << nodes.reason();
  setenv("OMP_NUM_THREADS", "1", 1);
  setenv("LOOM_RDZV_TOKEN", "veth-job-secret", 1);
  std::ofstream(dir / "c.yaml") << "run: {steps: 1, seed: 5}\nmodel: {type: gpt, preset: tiny}\n"
                                   "batch: {global: 8, micro: 4}\noptimizer: {type: sgd, lr: 0.3}\n"
                                   "comm: {backend: gloo, timeout_s: 60}\nparallel: {tp: 2}\n";
  const std::string port = std::to_string(loom::launch::free_port());
  auto node = [&](int k) {
    return "timeout 120 " + nodes.exec(k) + bin + "loomrun --nnodes 2 --node-rank " +
           std::to_string(k) + " --master-addr " + TwoNodes::kAddr0 + " --master-port " + port +
           " " + bin + "loom train " + (dir / "c.yaml").string() +
           " run.output_dir=" + (dir / "run").string() + " > " +
           (dir / ("node" + std::to_string(k) + ".log")).string() + " 2>&1";
  };
  const std::string stranger = "timeout 60 " + nodes.exec(1) + bin + "comm_worker stranger " +
                               TwoNodes::kAddr0 + " " + port + " > " +
                               (dir / "stranger.log").string() + " 2>&1";
  const std::string loopback = "timeout 10 " + nodes.exec(0) +
                               "bash -c 'exec 3<>/dev/tcp/127.0.0.1/" + port + "' 2> /dev/null";
  const std::string script =
      "(" + node(0) + ") & n0=$!; " + stranger + "; s=$?; " + loopback + "; l=$?; " + node(1) +
      "; n1=$?; wait $n0; n0=$?; echo $s $l $n1 $n0 > " + (dir / "codes").string();
  std::ofstream(dir / "run.sh") << script << "\n";
  sh("bash " + (dir / "run.sh").string());
  std::istringstream codes(read(dir / "codes"));
  int stranger_code = -1, loopback_code = -1, node1_code = -1, node0_code = -1;
  codes >> stranger_code >> loopback_code >> node1_code >> node0_code;
  const std::string logs = "stranger:\n" + read(dir / "stranger.log") + "\nnode 0:\n" +
                           read(dir / "node0.log") + "\nnode 1:\n" + read(dir / "node1.log");
  EXPECT_EQ(stranger_code, 0) << logs;
  EXPECT_NE(loopback_code, 0) << "node 0's store answered on its loopback address\n" << logs;
  EXPECT_EQ(node0_code, 0) << logs;
  EXPECT_EQ(node1_code, 0) << logs;
  const std::string node0 = read(dir / "node0.log");
  EXPECT_NE(node0.find("refused a connection from " + std::string(TwoNodes::kAddr1) + ":"),
            std::string::npos)
      << logs;
  EXPECT_NE(node0.find("wrong secret"), std::string::npos) << logs;
  EXPECT_NE(node0.find("not a loom rendezvous client"), std::string::npos) << logs;
}

}  // namespace
