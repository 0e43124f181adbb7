// A worker process for the multi-process tests, started by spawn_workers (gloo) or mpirun (mpi).
//
//   comm_worker primitives [timeout_s]   every primitive and sub-group with closed-form values
//   comm_worker kill [timeout_s]         three all_reduces, then the last rank is SIGKILLed while
//                                        the others wait in all_reduce #4
//   comm_worker latency                  prints the latency of small calls and the time of a 16 MiB
//                                        all_reduce (by hand, not a test)
//   comm_worker skip [timeout_s]         the same, but the last rank stays alive and never calls #4
//                                        (LOOM_TEST_VICTIM=r picks another rank)
//   comm_worker stranger HOST PORT       no rank: tries to join the store at HOST:PORT as a
//                                        stranger would; exit 0 when every try was refused
//
// The backend is `auto` (mpi under mpirun, gloo under spawn_workers) unless LOOM_TEST_BACKEND
// names one. Exit 0 when the scenario went as expected; every failure is printed.
#include <ATen/ops/ones.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "comm/make_comm.h"
#include "tests/comm/primitive_checks.h"
#include "tests/comm/stranger.h"

namespace {

using loom::Rank;
using loom::Status;
using loom::comm::Comm;

// Exits without running destructors: after a failure a backend may still hold a call in flight.
[[noreturn]] void leave(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

// Whether this process maps one of loom's shared-memory segments (an anonymous memfd, which
// /proc/self/maps shows by its name).
bool maps_loom_segment() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("memfd:loom-shm") != std::string::npos) return true;
  return false;
}

int primitives(Comm& comm) {
  Status s = loom::comm::testing::check_primitives(comm);
  if (s.ok()) s = loom::comm::testing::check_groups(comm);
  if (s.ok()) s = loom::comm::testing::check_large(comm);
  if (!s.ok()) {
    std::printf("[rank %lld] FAIL %s\n", static_cast<long long>(comm.rank().value()),
                s.error().message.c_str());
    leave(1);
  }
  std::printf("[rank %lld] ok on %s; shared memory mapped: %s\n",
              static_cast<long long>(comm.rank().value()), comm.backend_name(),
              maps_loom_segment() ? "yes" : "no");
  return 0;
}

// The last rank disappears before all_reduce #4 (killed, or alive but never calling); the others
// must fail within the timeout, naming the collective, its number and the missing rank.
int lose_last_rank(Comm& comm, bool kill_it, double timeout_s) {
  const int64_t r = comm.rank().value();
  const char* chosen = std::getenv("LOOM_TEST_VICTIM");  // default: the last rank
  const bool victim = r == (chosen != nullptr ? std::atoi(chosen) : comm.size() - 1);
  at::Tensor t = at::ones({1024});
  for (int i = 0; i < 3; ++i) {
    if (Status s = comm.all_reduce(t); !s.ok()) {
      std::printf("[rank %lld] FAIL early: %s\n", static_cast<long long>(r),
                  s.error().message.c_str());
      leave(1);
    }
  }
  if (victim) {
    // Let the others enter all_reduce #4 first.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (kill_it) raise(SIGKILL);
    std::this_thread::sleep_for(std::chrono::duration<double>(timeout_s + 1));
    leave(0);
  }
  const auto start = std::chrono::steady_clock::now();
  Status s = comm.all_reduce(t);
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (s.ok()) {
    std::printf("[rank %lld] FAIL all_reduce #4 succeeded without the last rank\n",
                static_cast<long long>(r));
    leave(1);
  }
  std::printf("[rank %lld] RESULT elapsed_s=%.3f error=%s\n", static_cast<long long>(r), elapsed,
              s.error().message.c_str());
  // Every survivor is done by the deadline; stay until then, since rank 0 hosts the store the
  // others read their diagnosis from, and under mpirun the first exit ends the job.
  std::this_thread::sleep_for(std::chrono::duration<double>(timeout_s + 0.5 - elapsed));
  leave(0);
}

// Latency of small all_reduces and send/recv pairs, for a look by hand (not a test).
int latency(Comm& comm) {
  at::Tensor t = at::ones({1});
  const int n = 2000;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    if (Status s = comm.all_reduce(t); !s.ok()) leave(1);
  }
  const double ar = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  start = std::chrono::steady_clock::now();
  const Rank peer(comm.rank().value() ^ 1);
  for (int i = 0; i < n && peer.value() < comm.size(); ++i) {
    Status s = comm.rank().value() % 2 == 0 ? comm.send(t, peer) : comm.recv(t, peer);
    if (s.ok()) s = comm.rank().value() % 2 == 0 ? comm.recv(t, peer) : comm.send(t, peer);
    if (!s.ok()) leave(1);
  }
  const double pp = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  at::Tensor big = at::ones({int64_t{4} << 20});  // 16 MiB of float32
  const int m = 20;
  start = std::chrono::steady_clock::now();
  for (int i = 0; i < m; ++i) {
    if (Status s = comm.all_reduce(big); !s.ok()) leave(1);
  }
  const double bw = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "[rank %lld] %s: all_reduce %.1f us, send+recv round trip %.1f us, "
      "all_reduce of 16 MiB %.2f ms\n",
      static_cast<long long>(comm.rank().value()), comm.backend_name(), ar / n * 1e6, pp / n * 1e6,
      bw / m * 1e3);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "primitives";
  const double timeout_s = argc > 2 ? std::atof(argv[2]) : 30;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (scenario == "stranger" && argc == 4) {
    int refused = 0;
    const auto tries = loom::comm::testing::try_as_stranger(argv[2], std::atoi(argv[3]), 30);
    for (const std::string& line : tries) {
      std::printf("%s\n", line.c_str());
      refused += line.rfind("refused", 0) == 0;
    }
    return refused == static_cast<int>(tries.size()) ? 0 : 1;
  }

  loom::comm::configure_worker_threads();
  loom::CommConfig config;
  const char* backend = std::getenv("LOOM_TEST_BACKEND");
  config.backend = backend != nullptr ? backend : "auto";
  // LOOM_TEST_SHARED_MEMORY=0: gloo's groups stay on sockets (comm.shared_memory: false).
  const char* shared = std::getenv("LOOM_TEST_SHARED_MEMORY");
  config.shared_memory = shared == nullptr || std::string(shared) != "0";
  // Starting several LibTorch processes on a loaded machine takes seconds: the rendezvous gets a
  // generous bound, the calls under test the scenario's timeout.
  config.timeout_s = std::max(30.0, timeout_s);
  auto comm = loom::comm::make_comm(config);
  if (!comm.ok()) {
    std::printf("FAIL make_comm: %s\n", comm.error().to_string().c_str());
    leave(2);
  }
  (*comm)->set_timeout(timeout_s);
  if (scenario == "primitives") return primitives(**comm);
  if (scenario == "kill") return lose_last_rank(**comm, /*kill_it=*/true, timeout_s);
  if (scenario == "skip") return lose_last_rank(**comm, /*kill_it=*/false, timeout_s);
  if (scenario == "latency") return latency(**comm);
  std::printf("FAIL unknown scenario %s\n", scenario.c_str());
  leave(2);
}
