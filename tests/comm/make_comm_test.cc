// Choosing and creating a backend from the config and the environment; clear errors for bad
// input; which backends this build registered; worker thread sizing.
#include "comm/make_comm.h"

#include <ATen/Parallel.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "launch/spawn.h"
#include "tests/comm/primitive_checks.h"

namespace loom::comm {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

CommConfig config(const std::string& backend, double timeout_s = 30) {
  CommConfig c;
  c.backend = backend;
  c.timeout_s = timeout_s;
  return c;
}

std::string error_of(const Result<std::shared_ptr<Comm>>& r) {
  return r.ok() ? "(no error)" : r.error().to_string();
}

bool built(const std::string& backend) {
  auto b = built_backends();
  return std::find(b.begin(), b.end(), backend) != b.end();
}

TEST(MakeComm, AutoWithoutLauncherIsAWorldOfOne) {
  auto comm = make_comm(config("auto"), env_of({}));
  ASSERT_TRUE(comm.ok()) << error_of(comm);
  EXPECT_EQ((*comm)->size(), 1);
  EXPECT_STREQ((*comm)->backend_name(), "local");
  EXPECT_TRUE(testing::check_primitives(**comm).ok());
}

// A run on GPUs started by a launcher talks over nccl: its error (bad RANK here, or a build
// without nccl) names nccl, never gloo. Alone (no WORLD_SIZE) it is still a world of one.
TEST(MakeComm, AutoOnGpusPicksNccl) {
  auto bad_rank = make_comm(config("auto"), env_of({{"WORLD_SIZE", "2"}, {"RANK", "2"}}), true);
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_EQ(bad_rank.error().key, "comm.backend");
  EXPECT_NE(error_of(bad_rank).find("nccl"), std::string::npos) << error_of(bad_rank);
  EXPECT_EQ(error_of(bad_rank).find("gloo"), std::string::npos) << error_of(bad_rank);
  auto alone = make_comm(config("auto"), env_of({}), true);
  ASSERT_TRUE(alone.ok()) << error_of(alone);
  EXPECT_STREQ((*alone)->backend_name(), "local");
}

// What `loom verify --ranks auto` and every worker's device read from the launcher.
TEST(MakeComm, StartedByLauncherAndLocalRank) {
  EXPECT_FALSE(started_by_launcher(env_of({})));
  EXPECT_FALSE(started_by_launcher(env_of({{"WORLD_SIZE", "1"}})));  // a world of one
  EXPECT_TRUE(started_by_launcher(env_of({{"WORLD_SIZE", "2"}})));
  EXPECT_TRUE(started_by_launcher(env_of({{"OMPI_COMM_WORLD_SIZE", "4"}})));
  EXPECT_TRUE(started_by_launcher(env_of({{"PMI_SIZE", "8"}})));
  EXPECT_EQ(local_rank(env_of({})), 0);
  EXPECT_EQ(local_rank(env_of({{"LOCAL_RANK", "3"}})), 3);
}

TEST(MakeComm, UnknownBackendNamesTheKey) {
  auto comm = make_comm(config("nccl2"), env_of({}));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.error().key, "comm.backend");
  EXPECT_EQ(comm.error().message,
            "unknown backend 'nccl2' (expected auto, gloo, mpi, nccl, local)");
}

TEST(MakeComm, BadTimeout) {
  auto comm = make_comm(config("local", 0), env_of({}));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.error().key, "comm.timeout_s");
}

TEST(MakeComm, GlooNeedsTheLauncherVariables) {
  if (!built("gloo")) GTEST_SKIP() << "this build has no gloo backend (LOOM_GLOO)";
  auto missing_size = make_comm(config("gloo"), env_of({}));
  EXPECT_NE(error_of(missing_size).find("gloo: WORLD_SIZE is not set"), std::string::npos)
      << error_of(missing_size);

  auto missing_addr =
      make_comm(config("gloo"), env_of({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"MASTER_PORT", "1"}}));
  EXPECT_NE(error_of(missing_addr).find("MASTER_ADDR is not set"), std::string::npos)
      << error_of(missing_addr);

  auto bad_port = make_comm(config("gloo"), env_of({{"WORLD_SIZE", "2"},
                                                    {"RANK", "0"},
                                                    {"MASTER_ADDR", "127.0.0.1"},
                                                    {"MASTER_PORT", "99999"}}));
  EXPECT_EQ(
      error_of(bad_port),
      "comm.backend: gloo: MASTER_PORT=99999 is not valid: expected a TCP port in [1, 65535]");

  auto bad_rank = make_comm(config("auto"), env_of({{"WORLD_SIZE", "2"}, {"RANK", "2"}}));
  EXPECT_EQ(error_of(bad_rank),
            "comm.backend: gloo: RANK=2 is not valid: expected a rank in [0, 1]");

  auto not_a_number = make_comm(config("gloo"), env_of({{"WORLD_SIZE", "two"}, {"RANK", "0"}}));
  EXPECT_NE(error_of(not_a_number).find("WORLD_SIZE=two is not valid"), std::string::npos);

  // Without the job's secret no rank hosts or joins a store that strangers could join.
  auto no_secret = make_comm(config("gloo"), env_of({{"WORLD_SIZE", "2"},
                                                     {"RANK", "0"},
                                                     {"MASTER_ADDR", "127.0.0.1"},
                                                     {"MASTER_PORT", "29500"}}));
  EXPECT_NE(error_of(no_secret).find("gloo: LOOM_RDZV_TOKEN is not set"), std::string::npos)
      << error_of(no_secret);
}

// Nobody hosts the store: rank 1 gives up at the timeout with a message, not a hang.
TEST(MakeComm, UnreachableRendezvousIsAClearErrorAtTheTimeout) {
  if (!built("gloo")) GTEST_SKIP() << "this build has no gloo backend (LOOM_GLOO)";
  const int port = launch::free_port();
  const auto start = Clock::now();
  auto comm = make_comm(config("gloo", 1.0), env_of({{"WORLD_SIZE", "2"},
                                                     {"RANK", "1"},
                                                     {"MASTER_ADDR", "127.0.0.1"},
                                                     {"MASTER_PORT", std::to_string(port)},
                                                     {"LOOM_RDZV_TOKEN", "s3cret"}}));
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5.0);
  std::cout << error_of(comm) << "\n";
  EXPECT_NE(error_of(comm).find("gloo: rank 1 could not reach the rendezvous store at 127.0.0.1:" +
                                std::to_string(port) + " within 1.0 s"),
            std::string::npos)
      << error_of(comm);
}

// Rank 0 hosts the store but rank 1 never comes.
TEST(MakeComm, MissingRankAtRendezvousIsAClearErrorAtTheTimeout) {
  if (!built("gloo")) GTEST_SKIP() << "this build has no gloo backend (LOOM_GLOO)";
  const int port = launch::free_port();
  auto comm = make_comm(config("gloo", 1.0), env_of({{"WORLD_SIZE", "2"},
                                                     {"RANK", "0"},
                                                     {"MASTER_ADDR", "127.0.0.1"},
                                                     {"MASTER_PORT", std::to_string(port)},
                                                     {"LOOM_RDZV_TOKEN", "s3cret"}}));
  EXPECT_EQ(error_of(comm),
            "comm.backend: gloo: rank 1 of 2 did not join the rendezvous store at "
            "127.0.0.1:" +
                std::to_string(port) + " (hosted by rank 0) within 1.0 s");
}

TEST(MakeComm, LocalCannotJoinAProcessWorld) {
  auto comm = make_comm(config("local"), env_of({{"WORLD_SIZE", "4"}, {"RANK", "0"}}));
  EXPECT_NE(error_of(comm).find("cannot join a world of WORLD_SIZE=4"), std::string::npos)
      << error_of(comm);
}

TEST(MakeComm, GlooWorldOfOneRunsEveryPrimitive) {
  if (!built("gloo")) GTEST_SKIP() << "this build has no gloo backend (LOOM_GLOO)";
  auto comm = make_comm(config("auto", 20), env_of({{"WORLD_SIZE", "1"}, {"RANK", "0"}}));
  ASSERT_TRUE(comm.ok()) << error_of(comm);
  EXPECT_STREQ((*comm)->backend_name(), "gloo");
  Status s = testing::check_primitives(**comm);
  EXPECT_TRUE(s.ok()) << s.error().to_string();
  s = testing::check_groups(**comm);
  EXPECT_TRUE(s.ok()) << s.error().to_string();
}

// One gloo per process: loom's gloo backend runs the gloo inside LibTorch (libtorch_cpu), never a
// second copy (a system libgloo). tests/comm/gloo_symbols.cmake checks the other half: loom's
// objects define no gloo code of their own.
TEST(MakeComm, GlooRunsTheCopyInsideLibTorch) {
  if (!built("gloo")) GTEST_SKIP() << "this build has no gloo backend (LOOM_GLOO)";
  auto comm = make_comm(config("gloo", 20), env_of({{"WORLD_SIZE", "1"}, {"RANK", "0"}}));
  ASSERT_TRUE(comm.ok()) << error_of(comm);
  at::Tensor t = at::ones({4});
  Status s = (*comm)->all_reduce(t);
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  std::ifstream maps("/proc/self/maps");
  std::string line;
  std::set<std::string> torch_cpu, gloo;
  while (std::getline(maps, line)) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string name = path.substr(path.rfind('/') + 1);
    if (name.rfind("libtorch_cpu.so", 0) == 0) torch_cpu.insert(path);
    if (name.find("gloo") != std::string::npos) gloo.insert(path);
  }
  EXPECT_EQ(torch_cpu.size(), 1u) << "libtorch_cpu mapped from " << torch_cpu.size() << " files";
  for (const auto& path : gloo) ADD_FAILURE() << "a second gloo is mapped: " << path;
}

TEST(MakeComm, RegisteredBackends) {
  EXPECT_TRUE(built("local"));
  EXPECT_EQ(built("gloo"), LOOM_EXPECT_GLOO != 0);
  EXPECT_EQ(built("mpi"), LOOM_EXPECT_MPI != 0);
  EXPECT_EQ(built("nccl"), LOOM_EXPECT_NCCL != 0);
}

TEST(MakeComm, NcclIsRegisteredWhenBuiltAndFailsClearlyOtherwise) {
  auto comm = make_comm(config("nccl", 5), env_of({{"WORLD_SIZE", "1"}, {"RANK", "0"}}));
  if (!built("nccl")) {
    EXPECT_EQ(error_of(comm),
              "comm.backend: nccl: this build of loom has no nccl backend (it needs the CUDA "
              "toolkit and NCCL at configure time, see LOOM_CUDA)");
    return;
  }
  // Built: this machine may have no GPU; then the error says so instead of crashing.
  if (!comm.ok()) {
    std::cout << "nccl here: " << comm.error().to_string() << "\n";
    EXPECT_EQ(comm.error().key, "comm.backend");
    EXPECT_EQ(comm.error().message.rfind("nccl: ", 0), 0u) << comm.error().message;
  } else {
    EXPECT_STREQ((*comm)->backend_name(), "nccl");
    EXPECT_EQ((*comm)->size(), 1);
    Status cpu = (*comm)->all_reduce(at::zeros({2}));
    ASSERT_FALSE(cpu.ok());
    EXPECT_NE(cpu.error().message.find("nccl backend needs CUDA tensors"), std::string::npos);
  }
}

TEST(MakeComm, GlooFailsClearlyWhenNotBuilt) {
  if (built("gloo")) GTEST_SKIP() << "gloo is built; the tests above run it";
  auto comm = make_comm(config("gloo"), env_of({{"WORLD_SIZE", "1"}, {"RANK", "0"}}));
  EXPECT_EQ(error_of(comm).rfind("comm.backend: gloo: this build of loom has no gloo backend", 0),
            0u)
      << error_of(comm);
}

TEST(MakeComm, MpiFailsClearlyWhenNotBuilt) {
  if (built("mpi")) GTEST_SKIP() << "mpi is built; tests/comm/mpi_test.cc runs it";
  auto comm = make_comm(config("mpi"), env_of({}));
  EXPECT_NE(error_of(comm).find("this build of loom has no mpi backend"), std::string::npos);
}

TEST(WorkerThreads, SplitsTheCoresAmongLocalWorkers) {
  const int one = configure_worker_threads(env_of({}));
  EXPECT_GE(one, 1);
  EXPECT_EQ(at::get_num_threads(), one);
  const int half = configure_worker_threads(env_of({{"LOCAL_WORLD_SIZE", "2"}}));
  EXPECT_EQ(half, std::max(1, one / 2));
  EXPECT_EQ(configure_worker_threads(env_of({{"LOCAL_WORLD_SIZE", "1000"}})), 1);
  EXPECT_EQ(at::get_num_threads(), 1);
  // Under mpirun or srun the local worker count comes from their variables.
  EXPECT_EQ(configure_worker_threads(env_of({{"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}})),
            std::max(1, one / 2));
  EXPECT_EQ(configure_worker_threads(env_of({{"SLURM_NTASKS_PER_NODE", "1000"}})), 1);
}

TEST(WorkerThreads, AnExplicitOmpNumThreadsWins) {
  EXPECT_EQ(configure_worker_threads(env_of({{"OMP_NUM_THREADS", "3"}, {"LOCAL_WORLD_SIZE", "2"}})),
            3);
  EXPECT_EQ(at::get_num_threads(), 3);
  // Not a positive integer: ignored, the cores are split as without it.
  const int split = configure_worker_threads(env_of({{"LOCAL_WORLD_SIZE", "1000"}}));
  for (const char* bad : {"0", "-2", "two", ""})
    EXPECT_EQ(
        configure_worker_threads(env_of({{"OMP_NUM_THREADS", bad}, {"LOCAL_WORLD_SIZE", "1000"}})),
        split)
        << bad;
}

}  // namespace
}  // namespace loom::comm
