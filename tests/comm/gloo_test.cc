// The gloo backend across real worker processes (comm_worker), started as loomrun would.
#include <gtest/gtest.h>

#include <regex>

#include "launch/spawn.h"

namespace loom::comm::testing {
namespace {

using launch::describe;
using launch::spawn_workers;

const std::string kWorker = std::string(LOOM_BINARY_DIR) + "/bin/comm_worker";
// Single-threaded LibTorch in every worker: the test machine may have two cores for all of them.
const std::map<std::string, std::string> kEnv = {{"LOOM_TEST_BACKEND", "gloo"},
                                                 {"OMP_NUM_THREADS", "1"}};

// With shared memory (the default: the workers share this host) every worker must have mapped
// a segment, and none without.
void expect_all_passed(int world_size, bool shared_memory = true) {
  auto env = kEnv;
  env["LOOM_TEST_SHARED_MEMORY"] = shared_memory ? "1" : "0";
  auto results = spawn_workers(kWorker, world_size, {"primitives", "20"}, 60, env);
  const std::string want =
      std::string("ok on gloo; shared memory mapped: ") + (shared_memory ? "yes" : "no");
  for (const auto& r : results) {
    EXPECT_TRUE(r.ok()) << describe(results);
    EXPECT_NE(r.output.find(want), std::string::npos) << describe(results);
  }
}

TEST(GlooProcesses, EveryPrimitiveTwoRanks) { expect_all_passed(2); }
TEST(GlooProcesses, EveryPrimitiveThreeRanks) { expect_all_passed(3); }
TEST(GlooProcesses, EveryPrimitiveOverSocketsOnly) { expect_all_passed(3, false); }

// The survivors report all_reduce #4 naming rank 2, within the timeout plus a margin.
void expect_rank_two_named(const std::string& scenario, double timeout_s) {
  auto results =
      spawn_workers(kWorker, 3, {scenario, std::to_string(timeout_s)}, timeout_s + 20, kEnv);
  const std::regex line(R"(RESULT elapsed_s=([0-9.]+) error=(.*))");
  for (int r : {0, 1}) {
    ASSERT_TRUE(results[r].ok()) << describe(results);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(results[r].output, m, line)) << describe(results);
    const double elapsed = std::stod(m[1]);
    const std::string error = m[2];
    EXPECT_LT(elapsed, timeout_s + 1.0) << error;
    EXPECT_EQ(error.rfind("all_reduce #4 on group world[0,1,2] ", 0), 0u) << error;
    EXPECT_NE(error.find("rank 2 did not arrive"), std::string::npos) << error;
    EXPECT_EQ(error.find("ranks "), std::string::npos) << "only rank 2 is missing: " << error;
  }
}

TEST(GlooProcesses, KilledRankIsNamedWithinTheTimeout) { expect_rank_two_named("kill", 2.0); }

TEST(GlooProcesses, RankThatNeverCallsIsNamedAtTheTimeout) { expect_rank_two_named("skip", 2.0); }

}  // namespace
}  // namespace loom::comm::testing
