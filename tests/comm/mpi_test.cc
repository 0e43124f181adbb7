// The mpi backend under mpirun: every primitive across 2 and 3 processes, and a rank that never
// calls a collective is named at the timeout.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <regex>
#include <sstream>

#include "launch/spawn.h"

namespace loom::comm::testing {
namespace {

using launch::find_program;
using launch::Launch;
using launch::mpirun_argv;
using launch::ProcessResult;
using launch::run_processes;

const std::string kWorker = std::string(LOOM_BINARY_DIR) + "/bin/comm_worker";

// mpirun -np n comm_worker args...; root needs --allow-run-as-root, and the test machine has
// fewer cores than ranks.
ProcessResult mpirun(int n, const std::vector<std::string>& args, double deadline_s) {
  Launch l;
  l.argv = mpirun_argv();
  l.argv.insert(l.argv.end(), {"-np", std::to_string(n), kWorker});
  for (const auto& a : args) l.argv.push_back(a);
  l.env = {{"LOOM_TEST_BACKEND", "mpi"}, {"OMP_NUM_THREADS", "1"}};
  return run_processes({l}, deadline_s)[0];
}

#define SKIP_WITHOUT_MPIRUN()         \
  if (find_program("mpirun").empty()) \
  GTEST_SKIP() << "mpirun is not installed (Open MPI's mpirun runs these)"

void expect_all_passed(int n) {
  ProcessResult r = mpirun(n, {"primitives", "20"}, 45);
  ASSERT_TRUE(r.ok()) << r.describe();
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_NE(r.output.find("[rank " + std::to_string(rank) + "] ok on mpi"), std::string::npos)
        << r.describe();
  }
}

TEST(MpiProcesses, EveryPrimitiveTwoRanks) {
  SKIP_WITHOUT_MPIRUN();
  expect_all_passed(2);
}

TEST(MpiProcesses, EveryPrimitiveThreeRanks) {
  SKIP_WITHOUT_MPIRUN();
  expect_all_passed(3);
}

TEST(MpiProcesses, RankThatNeverCallsIsNamedAtTheTimeout) {
  SKIP_WITHOUT_MPIRUN();
  const double timeout_s = 2.0;
  // The survivors leave without MPI_Finalize (a call is still in flight), so mpirun's own exit
  // status is not the point: their reports are.
  ProcessResult r = mpirun(3, {"skip", std::to_string(timeout_s)}, timeout_s + 30);
  ASSERT_FALSE(r.killed) << r.describe();
  for (int rank : {0, 1}) {
    const std::regex line("\\[rank " + std::to_string(rank) +
                          R"(\] RESULT elapsed_s=([0-9.]+) error=(.*))");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.output, m, line)) << r.describe();
    EXPECT_LT(std::stod(m[1]), timeout_s + 1.0);
    EXPECT_EQ(m[2].str(),
              "all_reduce #4 on group world[0,1,2] timed out after 2.0 s: rank 2 did not arrive");
  }
}

}  // namespace
}  // namespace loom::comm::testing
