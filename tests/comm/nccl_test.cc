// The nccl backend on CUDA tensors, in a world of one rank (one GPU): every primitive's
// closed-form check, sub-groups from ncclCommSplit, batch_isend_irecv as one NCCL group, waits
// that order the caller's stream without blocking the host, and a timeout found by the
// watchdog. Labelled `gpu`; without a GPU (or without the nccl backend, or with a LibTorch
// without CUDA) every test skips and says why. scripts/gpu-check runs them on a GPU machine.
#include <ATen/Context.h>
#include <ATen/ops/full.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "comm/comm.h"
#include "tests/comm/primitive_checks.h"

#if LOOM_EXPECT_NCCL
#include <cuda_runtime_api.h>

#include "comm/nccl_comm.h"
#include "comm/store.h"
#if LOOM_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif
#endif

namespace loom::comm {
namespace {

#if LOOM_EXPECT_NCCL

// A world of one nccl rank on cuda:0, or the reason there cannot be one here.
Result<std::shared_ptr<Comm>> one_rank_world(double timeout_s) {
  if (Status s = nccl_usable(); !s.ok()) return s.error();
  if (!at::hasCUDA()) return Error{"this LibTorch has no CUDA, so it makes no CUDA tensors", {}};
  LOOM_ASSIGN_OR_RETURN(
      auto store,
      RendezvousStore::connect(StoreAddress{"127.0.0.1", 0, "test-secret", ""}, 0, 1, timeout_s));
  return make_nccl_comm(std::move(store), 0, 1, 0, timeout_s);
}

#define LOOM_NCCL_WORLD(comm, timeout_s)                                 \
  Result<std::shared_ptr<Comm>> comm##_made = one_rank_world(timeout_s); \
  if (!comm##_made.ok()) GTEST_SKIP() << comm##_made.error().message;    \
  std::shared_ptr<Comm> comm = std::move(comm##_made).value()

cudaStream_t current_stream() {
#if LOOM_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(0).stream();
#else
  return cudaStreamLegacy;
#endif
}

// Holds the caller's stream for `ms` milliseconds with no kernel: a host function that sleeps.
void hold_stream(int ms) {
  static int held_ms;
  held_ms = ms;
  cudaLaunchHostFunc(
      current_stream(),
      [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(held_ms)); }, nullptr);
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(NcclComm, EveryPrimitiveOnCudaTensors) {
  LOOM_NCCL_WORLD(comm, 60);
  std::printf("NCCL %s\n", nccl_versions().c_str());
  Status s = testing::check_primitives(*comm, at::Device(at::kCUDA, 0));
  EXPECT_TRUE(s.ok()) << s.error().message;
}

TEST(NcclComm, SubGroupsBySplit) {
  LOOM_NCCL_WORLD(comm, 60);
  Status s = testing::check_groups(*comm, at::Device(at::kCUDA, 0));
  EXPECT_TRUE(s.ok()) << s.error().message;
  // A sub-group of one runs every primitive too.
  auto solo = comm->new_group({Rank(0)}, "solo");
  ASSERT_TRUE(solo.ok()) << solo.error().message;
  ASSERT_NE(*solo, nullptr);
  s = testing::check_primitives(**solo, at::Device(at::kCUDA, 0));
  EXPECT_TRUE(s.ok()) << s.error().message;
}

TEST(NcclComm, BatchIsOneGroupWithPairsToItself) {
  LOOM_NCCL_WORLD(comm, 60);
  const at::TensorOptions cuda = at::TensorOptions().device(at::kCUDA, 0);
  at::Tensor a = at::full({4}, 3.0, cuda), b = at::full({2, 3}, 7.0, cuda.dtype(at::kLong));
  at::Tensor got_a = at::full({4}, -1.0, cuda), got_b = at::full({6}, -1.0, cuda.dtype(at::kLong));
  Work w =
      comm->batch_isend_irecv({P2POp::send(a, Rank(0), 0), P2POp::send(b, Rank(0), 1),
                               P2POp::recv(got_b, Rank(0), 1), P2POp::recv(got_a, Rank(0), 0)});
  ASSERT_TRUE(w.wait().ok());
  EXPECT_TRUE(got_a.cpu().eq(3.0).all().item<bool>());
  EXPECT_TRUE(got_b.cpu().eq(7).all().item<bool>());
}

TEST(NcclComm, WaitOrdersTheStreamWithoutBlockingTheHost) {
  LOOM_NCCL_WORLD(comm, 60);
  at::Tensor t = at::full({1 << 20}, 2.0, at::TensorOptions().device(at::kCUDA, 0));
  hold_stream(400);
  const Clock::time_point start = Clock::now();
  Work w = comm->all_reduce_async(t);
  ASSERT_TRUE(w.wait().ok());
  EXPECT_LT(seconds_since(start), 0.2) << "wait() blocked the host";
  EXPECT_TRUE(w.synchronize().ok());
  EXPECT_GE(seconds_since(start), 0.3) << "the collective did not wait for the caller's stream";
  EXPECT_TRUE(t.cpu().eq(2.0).all().item<bool>());
}

TEST(NcclComm, WatchdogTimesOutAbortsAndNamesTheCall) {
  LOOM_NCCL_WORLD(comm, 60);
  at::Tensor t = at::full({8}, 1.0, at::TensorOptions().device(at::kCUDA, 0));
  ASSERT_TRUE(comm->all_reduce(t).ok());  // #1, connections made
  comm->set_timeout(0.3);
  hold_stream(2000);  // the collective cannot start before its deadline
  Work w = comm->all_reduce_async(t);
  ASSERT_TRUE(w.wait().ok());  // ordered on the device; the watchdog holds the deadline
  const Clock::time_point start = Clock::now();
  while (comm->status().ok() && seconds_since(start) < 5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Status status = comm->status();
  ASSERT_FALSE(status.ok()) << "the watchdog did not report the timeout";
  EXPECT_EQ(
      status.error().message.rfind("all_reduce #2 on group world[0] timed out after 0.30 s", 0), 0u)
      << status.error().message;
  Status again = comm->all_reduce(t);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.error().message.find("unusable after an earlier failure: all_reduce #2"),
            std::string::npos)
      << again.error().message;
  // The aborted communicator lets the stream drain.
  EXPECT_FALSE(w.synchronize().ok());
  cudaDeviceSynchronize();
}

#else

TEST(NcclComm, EveryPrimitiveOnCudaTensors) {
  GTEST_SKIP() << "this build has no nccl backend (configure with the CUDA toolkit and NCCL, "
                  "LOOM_CUDA=ON)";
}

#endif

}  // namespace
}  // namespace loom::comm
