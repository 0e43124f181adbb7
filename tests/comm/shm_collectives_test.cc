// The shared-memory collectives of the gloo backend, with threads of one process as the members
// of a group (they map the same segment as processes on one host would); and a wait for a member
// whose process died.
#include "comm/shm_collectives.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "comm/shm_segment.h"
#include "comm/store.h"

namespace loom::comm {
namespace {

// One store client per member, as processes have: a store client serves one call at a time, so
// members sharing one would wait on each other's blocking gets. Member 0 hosts; member r joins a
// "world" of r + 1, whose other members have joined already.
std::vector<std::shared_ptr<RendezvousStore>> stores_for(int size) {
  std::vector<std::shared_ptr<RendezvousStore>> stores;
  for (int r = 0; r < size; ++r) {
    auto store = RendezvousStore::connect(
        StoreAddress{"127.0.0.1", r == 0 ? 0 : stores[0]->port(), "test-secret", ""}, r, r + 1, 30);
    EXPECT_TRUE(store.ok()) << store.error().message;
    if (!store.ok()) return {};
    stores.push_back(*store);
  }
  return stores;
}

// Every member's ShmGroup, connected concurrently as the members of a group are.
std::vector<std::shared_ptr<ShmGroup>> connect_all(const std::string& key, int size) {
  auto stores = stores_for(size);
  std::vector<std::shared_ptr<ShmGroup>> groups(size);
  if (stores.empty()) return groups;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      std::string why;
      auto g = ShmGroup::connect(*stores[r], key, r, size, &why);
      ASSERT_TRUE(g.ok()) << g.error().message;
      groups[r] = *g;
      EXPECT_NE(groups[r], nullptr) << why;
    });
  for (auto& t : threads) t.join();
  return groups;
}

Clock::time_point in_seconds(double s) { return deadline_after(Clock::now(), s); }

TEST(ShmCollectives, AllReduceAndReduceScatterOverChunksGiveEveryMemberTheSameBits) {
  const int size = 3;
  auto groups = connect_all("t/sum", size);
  for (const auto& g : groups) ASSERT_NE(g, nullptr);
  // 700001 floats span several 1 MiB chunks and no chunk or member count divides them; random
  // values make the result depend on the order of the sums, which must not differ by member.
  const int64_t n = 700001;
  std::vector<at::Tensor> mine, want(1, at::zeros({n}, at::kDouble));
  for (int r = 0; r < size; ++r) {
    mine.push_back(at::randn({n}, at::TensorOptions().dtype(at::kFloat)));
    want[0] += mine.back().to(at::kDouble);
  }
  std::vector<at::Tensor> reduced(size), scattered(size);
  const int64_t m = n / size;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      reduced[r] = mine[r].clone();
      auto op = groups[r]->all_reduce(reduced[r], ReduceOp::kSum, in_seconds(30));
      EXPECT_TRUE(op->wait_until(in_seconds(30)).ok());
      scattered[r] = at::empty({m});
      op = groups[r]->reduce_scatter(scattered[r], mine[r].narrow(0, 0, size * m), ReduceOp::kSum,
                                     in_seconds(30));
      EXPECT_TRUE(op->wait_until(in_seconds(30)).ok());
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(at::equal(reduced[r], reduced[0])) << "member " << r;
    // Three float32 sums of values of about 1: within a few ulps of 3 of the exact sum.
    EXPECT_LT((reduced[r].to(at::kDouble) - want[0]).abs().max().item<double>(), 1e-5);
    EXPECT_LT(
        (scattered[r].to(at::kDouble) - want[0].narrow(0, r * m, m)).abs().max().item<double>(),
        1e-5);
  }
}

TEST(ShmCollectives, MemberThatNeverCallsTimesTheOthersOutAndTheGroupStaysFailed) {
  auto groups = connect_all("t/late", 3);
  for (const auto& g : groups) ASSERT_NE(g, nullptr);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      at::Tensor t = at::ones({1000});
      const auto start = Clock::now();
      auto op = groups[r]->all_reduce(t, ReduceOp::kSum, in_seconds(0.5));
      const Outcome first = op->wait_until(in_seconds(10));
      const double waited = std::chrono::duration<double>(Clock::now() - start).count();
      EXPECT_EQ(first.kind, Outcome::Kind::kTimedOut);
      EXPECT_GE(waited, 0.45);
      EXPECT_LT(waited, 2.0);  // the call's own deadline, not the waiter's
      const Outcome next = groups[r]->broadcast(t, 0, in_seconds(10))->wait_until(in_seconds(10));
      EXPECT_EQ(next.kind, Outcome::Kind::kFailed);
      EXPECT_NE(next.detail.find("earlier call"), std::string::npos) << next.detail;
    });
  for (auto& t : threads) t.join();
}

TEST(ShmSegment, OpeningChecksTheNameAndTheToken) {
  auto created = SharedSegment::create(2, 4096, 42);
  ASSERT_TRUE(created.ok()) << created.error().message;
  const std::string name = (*created)->name();
  EXPECT_TRUE(SharedSegment::open(name, 2, 4096, 42).ok());
  auto other = SharedSegment::open(name, 2, 4096, 43);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.error().message.find("another group"), std::string::npos);
  (*created)->unlink();
  EXPECT_FALSE(SharedSegment::open(name, 2, 4096, 42).ok()) << "unlinked: no new member maps it";
  EXPECT_FALSE(SharedSegment::open("/proc/self/fd/99999", 2, 4096, 42).ok());
}

// A member whose process has ended fails the wait at once (well before the deadline), naming
// it: first while the dead process is a zombie (not reaped yet), then once it is gone.
TEST(ShmSegment, AWaitForADeadMemberEndsWithoutWaitingOutTheDeadline) {
  auto segment = SharedSegment::create(2, 4096, 7);
  ASSERT_TRUE(segment.ok()) << segment.error().message;
  SharedSegment& s = **segment;
  s.enter(0, getpid());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);  // member 1's process, dead before it ever arrives
  s.enter(1, child);
  std::atomic<bool> stop{false};
  for (const bool reaped : {false, true}) {
    if (reaped) {
      ASSERT_EQ(waitpid(child, nullptr, 0), child);
    }
    s.arrive(0, reaped ? 2 : 1);
    const auto start = Clock::now();
    EXPECT_EQ(s.wait_all(0, reaped ? 2 : 1, in_seconds(30), stop), SharedSegment::Wait::kPeerLost)
        << (reaped ? "reaped" : "zombie");
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5.0);
    EXPECT_EQ(s.lost_member(), 1);
    EXPECT_EQ(s.pid_of(1), child);
  }
  // A live member that is merely late is waited for until the deadline.
  s.enter(1, getpid());
  EXPECT_EQ(s.wait_all(0, 3, in_seconds(0.2), stop), SharedSegment::Wait::kTimedOut);
}

}  // namespace
}  // namespace loom::comm
