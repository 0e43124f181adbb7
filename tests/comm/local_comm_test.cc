// The local backend: every primitive with closed-form values, sub-groups, async handles, and the
// diagnostics of a call that cannot finish.
#include "comm/local_comm.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include "tests/comm/primitive_checks.h"

namespace loom::comm {
namespace {

using testing::check_groups;
using testing::check_primitives;

void expect_all_ok(const std::vector<Status>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].error().to_string();
  }
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One ctest entry per behaviour, looping over world sizes: each entry costs a LibTorch start.
TEST(LocalComm, EveryPrimitiveHasClosedFormValues) {
  for (int size : {1, 2, 3, 4, 5}) {
    SCOPED_TRACE("world size " + std::to_string(size));
    LocalWorld world(size, /*timeout_s=*/20);
    expect_all_ok(world.run([](Comm& comm) { return check_primitives(comm); }));
  }
}

TEST(LocalComm, SubGroups) {
  for (int size : {1, 2, 3, 4, 5}) {
    SCOPED_TRACE("world size " + std::to_string(size));
    LocalWorld world(size, /*timeout_s=*/20);
    expect_all_ok(world.run([](Comm& comm) { return check_groups(comm); }));
  }
}

TEST(LocalComm, NamesAndRanks) {
  LocalWorld world(3);
  auto comm = world.comm(Rank(1));
  EXPECT_EQ(comm->rank(), Rank(1));
  EXPECT_EQ(comm->size(), 3);
  EXPECT_STREQ(comm->backend_name(), "local");
  EXPECT_EQ(comm->group_name(), "world[0,1,2]");
  EXPECT_EQ(comm->world_rank(), Rank(1));
  auto results = world.run([](Comm& c) -> Status {
    LOOM_ASSIGN_OR_RETURN(auto g, c.new_group({Rank(2), Rank(1)}, "pp"));
    if (g && (g->world_rank() != c.rank() || g->group_name() != "pp[2,1]")) {
      return Error{"wrong names in pp: " + g->group_name(), {}};
    }
    return Status::success();
  });
  for (const Status& s : results) EXPECT_TRUE(s.ok()) << s.error().message;
}

TEST(LocalComm, TimeoutNamesCollectiveSequenceAndMissingRank) {
  LocalWorld world(3, /*timeout_s=*/0.3);
  std::vector<double> elapsed(3);
  std::vector<Status> results = world.run([&](Comm& comm) -> Status {
    at::Tensor t = at::ones({4});
    LOOM_TRY(comm.all_reduce(t));                          // #1: everyone
    if (comm.rank() == Rank(2)) return Status::success();  // never calls #2
    auto start = Clock::now();
    Status s = comm.all_reduce(t);
    elapsed[comm.rank().value()] = seconds_since(start);
    return s;
  });
  EXPECT_TRUE(results[2].ok());
  for (int r : {0, 1}) {
    ASSERT_FALSE(results[r].ok());
    EXPECT_EQ(results[r].error().message,
              "all_reduce #2 on group world[0,1,2] timed out after 0.30 s: rank 2 did not arrive");
    EXPECT_GE(elapsed[r], 0.29);
    EXPECT_LT(elapsed[r], 0.3 + 1.0);
  }
  // The group is unusable afterwards, and says why.
  Status again = world.comm(Rank(0))->barrier();
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.error().message.find("unusable after an earlier failure: all_reduce #2"),
            std::string::npos)
      << again.error().message;
}

TEST(LocalComm, TimeoutInASubGroupNamesTheGroup) {
  LocalWorld world(3, /*timeout_s=*/0.2);
  std::vector<Status> results = world.run([&](Comm& comm) -> Status {
    LOOM_ASSIGN_OR_RETURN(auto dp, comm.new_group({Rank(0), Rank(2)}, "dp"));
    if (!dp) return Status::success();
    at::Tensor t = at::ones({2});
    LOOM_TRY(dp->all_reduce(t));
    LOOM_TRY(dp->barrier());
    if (comm.rank() == Rank(2)) return Status::success();
    return dp->all_gather_flat(at::zeros({4}), t);
  });
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(results[0].error().message,
            "all_gather #3 on group dp[0,2] timed out after 0.20 s: rank 2 did not arrive");
  EXPECT_TRUE(results[1].ok());
  EXPECT_TRUE(results[2].ok());
}

TEST(LocalComm, NewGroupIsCollectiveOverTheParent) {
  LocalWorld world(3, /*timeout_s=*/0.2);
  std::vector<Status> results = world.run([&](Comm& comm) -> Status {
    if (comm.rank() == Rank(1)) return Status::success();  // not a member, and does not call
    auto group = comm.new_group({Rank(0), Rank(2)}, "dp");
    return group.ok() ? Status() : Status(group.error());
  });
  for (int r : {0, 2}) {
    ASSERT_FALSE(results[r].ok());
    const std::string& m = results[r].error().message;
    EXPECT_EQ(m.rfind("new_group #1 on group world[0,1,2] failed after ", 0), 0u) << m;
    EXPECT_NE(m.find("not every rank of the group arrived before the deadline; rank 1 did not "
                     "arrive"),
              std::string::npos)
        << m;
  }
}

TEST(LocalComm, SeveralMissingRanks) {
  LocalWorld world(4, /*timeout_s=*/0.2);
  std::vector<Status> results = world.run([&](Comm& comm) -> Status {
    if (comm.rank().value() >= 2) return Status::success();
    return comm.barrier();
  });
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(results[0].error().message,
            "barrier #1 on group world[0,1,2,3] timed out after 0.20 s: ranks 2, 3 did not arrive");
}

// The 1F1B exchange of a pipeline block: each rank of a pair sends before it receives. Blocking
// send/recv in that order deadlocks on a backend without buffering; a batch does not, in
// whatever order each rank lists its ops.
TEST(LocalComm, BatchIsendIrecvOneFOneBExchange) {
  for (int size : {2, 3, 4}) {
    SCOPED_TRACE("world size " + std::to_string(size));
    LocalWorld world(size, /*timeout_s=*/20);
    expect_all_ok(world.run([](Comm& comm) -> Status {
      const int64_t r = comm.rank().value(), s = comm.size(), n = 4;
      const int64_t next = (r + 1) % s, prev = (r + s - 1) % s;
      // Activations go forward to `next`, gradients back to `prev`, in one batch each.
      at::Tensor act = at::arange(n, at::kFloat).add_(static_cast<double>(r * n));
      at::Tensor grad = at::arange(n, at::kFloat).add_(static_cast<double>(100 + r * n));
      at::Tensor act_in = at::full({n}, -1.0), grad_in = at::full({n}, -1.0);
      std::vector<P2POp> ops{P2POp::send(act, Rank(next), 0), P2POp::send(grad, Rank(prev), 1),
                             P2POp::recv(act_in, Rank(prev), 0),
                             P2POp::recv(grad_in, Rank(next), 1)};
      if (r % 2 == 1) std::reverse(ops.begin(), ops.end());
      LOOM_TRY(comm.batch_isend_irecv(ops).wait());
      for (int64_t i = 0; i < n; ++i) {
        if (act_in[i].item<double>() != prev * n + i ||
            grad_in[i].item<double>() != 100 + next * n + i) {
          return Error{"rank " + std::to_string(r) + ": element " + std::to_string(i) +
                           " is wrong: " + std::to_string(act_in[i].item<double>()) + ", " +
                           std::to_string(grad_in[i].item<double>()),
                       {}};
        }
      }
      // Numbered like single sends and receives: a plain pair after the batch still matches.
      at::Tensor one = at::full({1}, static_cast<double>(r)), got = at::full({1}, -1.0);
      Work sent = comm.send_async(one, Rank(next), 0);
      LOOM_TRY(comm.recv(got, Rank(prev), 0));
      LOOM_TRY(sent.wait());
      if (got.item<double>() != prev) return Error{"plain recv after a batch: wrong value", {}};
      return Status::success();
    }));
  }
}

TEST(LocalComm, BatchIsendIrecvChecksItsOps) {
  LocalWorld world(2, /*timeout_s=*/5);
  auto comm = world.comm(Rank(0));
  at::Tensor t = at::zeros({3});
  auto message = [](const Work& w) {
    Work copy = w;
    Status s = copy.wait();
    return s.ok() ? std::string("ok") : s.error().message;
  };
  EXPECT_EQ(message(comm->batch_isend_irecv({})),
            "batch_isend_irecv on group world[0,1]: no ops given");
  EXPECT_EQ(message(comm->batch_isend_irecv({P2POp::send(t, Rank(0), 3)})),
            "batch_isend_irecv on group world[0,1]: 1 send(s) to this rank with tag 3 but 0 "
            "recv(s) from it; each needs its match in the batch");
  EXPECT_EQ(message(comm->batch_isend_irecv(
                {P2POp::send(t, Rank(0)), P2POp::recv(at::zeros({2}), Rank(0))})),
            "batch_isend_irecv on group world[0,1]: ops[1] receives [2] Float from this rank, but "
            "the matching send ops[0] is [3] Float");
  const std::string bad_peer = message(comm->batch_isend_irecv({P2POp::recv(t, Rank(2))}));
  EXPECT_NE(bad_peer.find("rank 2 is not in the group"), std::string::npos) << bad_peer;
  // Argument errors leave the group usable.
  EXPECT_TRUE(comm->status().ok());
}

TEST(LocalComm, BatchTimeoutNamesEveryMissingPeer) {
  LocalWorld world(3, /*timeout_s=*/0.2);
  std::vector<Status> results = world.run([&](Comm& comm) -> Status {
    if (comm.rank() != Rank(0)) return Status::success();  // peers never answer
    at::Tensor a = at::zeros({2}), b = at::zeros({2});
    return comm.batch_isend_irecv({P2POp::send(a, Rank(1), 0), P2POp::recv(b, Rank(2), 5)}).wait();
  });
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(results[0].error().message,
            "batch_isend_irecv of 2 ops (send #1 to rank 1 (tag 0), recv #1 from rank 2 (tag 5)) "
            "on group world[0,1,2] timed out after 0.20 s: rank 1 did not arrive at the matching "
            "recv; rank 2 did not arrive at the matching send");
  EXPECT_FALSE(world.comm(Rank(0))->status().ok());
}

TEST(LocalComm, RecvTimeoutNamesThePeer) {
  LocalWorld world(2, /*timeout_s=*/0.2);
  std::vector<Status> results = world.run([&](Comm& comm) -> Status {
    if (comm.rank() == Rank(1)) return Status::success();
    return comm.recv(at::zeros({3}), Rank(1), 5);
  });
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(results[0].error().message,
            "recv #1 from rank 1 (tag 5) on group world[0,1] timed out after 0.20 s: rank 1 did "
            "not arrive at the matching send");
}

TEST(LocalComm, MismatchedCollectivesFail) {
  LocalWorld world(2, /*timeout_s=*/2);
  std::vector<Status> results = world.run([&](Comm& comm) -> Status {
    at::Tensor t = at::ones({2});
    return comm.rank() == Rank(0) ? comm.all_reduce(t) : comm.broadcast(t, Rank(0));
  });
  for (const Status& s : results) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().message.find("as collective #1 while rank"), std::string::npos)
        << s.error().message;
  }
}

TEST(LocalComm, WrongSizesAcrossRanksFail) {
  LocalWorld world(2, /*timeout_s=*/2);
  std::vector<Status> results = world.run([&](Comm& comm) -> Status {
    const int64_t r = comm.rank().value();
    // Rank 1 expects 3 elements from rank 0, which sends 2.
    std::vector<at::Tensor> in{at::ones({1}), at::ones({2})};
    std::vector<at::Tensor> out{at::zeros({r == 1 ? 3 : 1}), at::zeros({r == 0 ? 1 : 2})};
    return comm.all_to_all(out, in);
  });
  ASSERT_FALSE(results[1].ok());
  EXPECT_NE(results[1].error().message.find(
                "rank 0 sent 2 elements to rank 1, which expected 3 elements; every rank arrived"),
            std::string::npos)
      << results[1].error().message;
}

TEST(LocalComm, BadArgumentsAreErrorsAndLeaveTheGroupUsable) {
  LocalWorld world(2, /*timeout_s=*/5);
  std::vector<Status> results = world.run([&](Comm& comm) -> Status {
    auto expect_error = [&](Status s, const std::string& part) -> Status {
      if (s.ok()) return Error{"expected an error containing '" + part + "'", {}};
      if (s.error().message.find(part) == std::string::npos) {
        return Error{"error '" + s.error().message + "' lacks '" + part + "'", {}};
      }
      return Status::success();
    };
    const Rank me = comm.rank();
    LOOM_TRY(expect_error(comm.send(at::ones({1}), me), "cannot send to itself"));
    LOOM_TRY(expect_error(comm.send(at::ones({1}), Rank(5)), "rank 5 is not in the group"));
    LOOM_TRY(expect_error(comm.all_gather({at::zeros({1})}, at::ones({1})),
                          "out has 1 tensors, expected 2"));
    LOOM_TRY(expect_error(comm.all_reduce(at::ones({1}, at::kLong), ReduceOp::kAvg),
                          "avg needs a floating-point tensor"));
    LOOM_TRY(expect_error(comm.all_gather_flat(at::zeros({3}), at::ones({2})),
                          "out needs 2 x 2 elements"));
    LOOM_TRY(
        expect_error(comm.reduce_scatter(at::zeros({2}), {at::ones({2}), at::ones({2}, at::kLong)}),
                     "in[j] is Long, expected Float"));
    auto twice = comm.new_group({Rank(0), Rank(0)});
    LOOM_TRY(expect_error(twice.ok() ? Status() : Status(twice.error()), "rank 0 is listed twice"));
    LOOM_TRY(expect_error(comm.broadcast(at::ones({1}), Rank(-1)), "rank -1 is not in the group"));
    LOOM_TRY(expect_error(Work().wait(), "empty Work"));
    // Nothing was started, so the group still works and numbering starts at #1.
    if (comm.collective_count() != 0) return Error{"bad calls consumed sequence numbers", {}};
    return comm.barrier();
  });
  expect_all_ok(results);
}

TEST(LocalComm, ManyAsyncCollectivesInFlight) {
  LocalWorld world(4, /*timeout_s=*/20);
  auto start = Clock::now();
  expect_all_ok(world.run([](Comm& comm) -> Status {
    const double r = static_cast<double>(comm.rank().value());
    std::vector<at::Tensor> ts;
    std::vector<Work> works;
    for (int k = 0; k < 200; ++k) {
      ts.push_back(at::full({16}, r + k));
      works.push_back(comm.all_reduce_async(ts.back()));
    }
    for (int k = 199; k >= 0; --k) {
      LOOM_TRY(works[k].wait());
      const double want = 6.0 + 4.0 * k;  // sum over r of (r + k)
      if (ts[k][0].item<double>() != want) return Error{"wrong sum at " + std::to_string(k), {}};
    }
    return Status::success();
  }));
  EXPECT_LT(seconds_since(start), 5.0);
}

}  // namespace
}  // namespace loom::comm
