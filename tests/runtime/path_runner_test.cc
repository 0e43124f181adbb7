// Executing communication paths on the local backend: random source and target layouts over
// random shapes and 1-8 devices (within a group and across two groups); every rank must end up
// holding exactly its target piece of the tensor.
#include "runtime/path_runner.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <mutex>
#include <random>

#include "comm/local_comm.h"
#include "runtime/oracle.h"
#include "tests/lower/random_layout.h"

namespace loom::runtime {
namespace {

std::vector<DeviceId> devices(int from, int count) {
  std::vector<DeviceId> out;
  for (int i = 0; i < count; ++i) out.push_back(DeviceId(from + i));
  return out;
}

int64_t position(const lower::Layout& l, int64_t rank) {
  for (size_t p = 0; p < l.devices.size(); ++p)
    if (l.devices[p].value() == rank) return static_cast<int64_t>(p);
  return -1;
}

// With `prepost`, every rank posts the receives of the path's first transfer before running it
// (as the executor does one block ahead); run() must take them and flush() finds none left.
void run_case(const Shape& shape, const lower::Layout& from, const lower::Layout& to,
              int world_size, bool gradient, bool prepost = false) {
  lower::PathFinder finder;
  auto path = finder.find(shape, 4, from, to, gradient);
  ASSERT_TRUE(path.ok()) << path.error().message;
  at::Tensor full = at::randn(shape, at::TensorOptions().dtype(at::kFloat));
  comm::LocalWorld world(world_size, 30);
  std::mutex mu;
  std::vector<std::string> problems;
  auto statuses = world.run([&](comm::Comm& c) -> Status {
    at::set_num_threads(1);
    PathRunner runner(c.shared_from_this());
    LOOM_TRY(runner.add_groups({&*path}));
    const int64_t rank = c.world_rank().value();
    at::Tensor x;
    if (int64_t p = position(from, rank); p >= 0)
      x = cut_piece(full, from.piece(p, TensorId(0), shape));
    if (prepost) runner.prepost(*path, shape, PathPart::kAll, 0);
    LOOM_ASSIGN_OR_RETURN(at::Tensor y, runner.run(*path, shape, x, PathPart::kAll, 0));
    LOOM_TRY(runner.flush());
    const int64_t q = position(to, rank);
    if (q < 0) return Status::success();
    graph::SubTensor want_piece = to.piece(q, TensorId(0), shape);
    at::Tensor want = cut_piece(full, want_piece);
    std::lock_guard<std::mutex> lock(mu);
    if (!y.defined() || y.sizes() != want.sizes()) {
      problems.push_back("rank " + std::to_string(rank) + " holds the wrong shape for " +
                         want_piece.ranges_string());
    } else if (!gradient && !at::allclose(y, want, 1e-5, 1e-6)) {
      problems.push_back("rank " + std::to_string(rank) + " holds wrong values for " +
                         want_piece.ranges_string());
    }
    return Status::success();
  });
  for (int r = 0; r < world_size; ++r) ASSERT_TRUE(statuses[r].ok()) << statuses[r].error().message;
  EXPECT_TRUE(problems.empty()) << from.to_string() << " -> " << to.to_string() << " via "
                                << path->to_string() << ": " << problems[0];
}

TEST(PathRunner, RandomLayoutsWithinAGroup) {
  std::mt19937 rng(5);
  const int64_t dims[] = {2, 4, 6, 8};
  for (int iter = 0; iter < 200; ++iter) {
    Shape shape;
    size_t ndim = 1 + rng() % 3;
    for (size_t k = 0; k < ndim; ++k) shape.push_back(dims[rng() % 4]);
    int n = 1 + static_cast<int>(rng() % 8);
    lower::Layout from = lower::random_layout(rng, shape, devices(0, n));
    lower::Layout to = lower::random_layout(rng, shape, devices(0, n));
    run_case(shape, from, to, n, false);
    if (HasFatalFailure() || HasFailure()) return;
  }
}

void across_groups(bool prepost) {
  std::mt19937 rng(9);
  const int64_t dims[] = {2, 4, 8};
  for (int iter = 0; iter < 100; ++iter) {
    Shape shape;
    size_t ndim = 1 + rng() % 3;
    for (size_t k = 0; k < ndim; ++k) shape.push_back(dims[rng() % 3]);
    int n1 = 1 + static_cast<int>(rng() % 4), n2 = 1 + static_cast<int>(rng() % 4);
    lower::Layout from = lower::random_layout(rng, shape, devices(0, n1));
    lower::Layout to = lower::random_layout(rng, shape, devices(n1, n2));
    run_case(shape, from, to, n1 + n2, false, prepost);
    if (testing::Test::HasFatalFailure() || testing::Test::HasFailure()) return;
  }
}

TEST(PathRunner, RandomLayoutsAcrossGroups) { across_groups(false); }
TEST(PathRunner, RandomLayoutsAcrossGroupsWithPostedReceives) { across_groups(true); }

}  // namespace
}  // namespace loom::runtime

namespace loom::runtime {
namespace {

// A mixture of experts' buffer [batch 4, experts 4, slots 6, hidden 3] moving from a batch split
// to an expert split over 4 ranks (the dispatch all-to-all), with a different number of filled
// slots per (sample, expert) and some all empty: the ragged all-to-all, which sends only each
// piece's slots up to its last non-zero one, delivers exactly the pieces of the plain one.
TEST(PathRunner, RunsEveryPrimitiveOfTheRegistry) {
  for (const lower::PrimitiveRule& rule : lower::primitive_rules())
    EXPECT_TRUE(PathRunner::can_run(rule.primitive)) << rule.name;
}

TEST(PathRunner, RaggedAllToAllDeliversThePlainOnesPieces) {
  const Shape shape{4, 4, 6, 3};
  const lower::Layout from = lower::Layout::split(4, 0, devices(0, 4));
  const lower::Layout to = lower::Layout::split(4, 1, devices(0, 4));
  lower::PathFinder finder;
  auto path = finder.find(shape, 4, from, to, false);
  ASSERT_TRUE(path.ok()) << path.error().message;
  ASSERT_EQ(path->steps.size(), 1u);
  ASSERT_EQ(path->steps[0].primitive, lower::Primitive::kAllToAll);
  at::Tensor full = at::randn(shape, at::TensorOptions().dtype(at::kFloat)) + 10;
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t e = 0; e < 4; ++e) {
      const int64_t filled = (b * 3 + e * 5) % 7;  // 0 to 6 slots, rank 0's to rank 0: some 0
      full[b][e].narrow(0, std::min<int64_t>(filled, 6), 6 - std::min<int64_t>(filled, 6)).zero_();
    }
  comm::LocalWorld world(4, 30);
  std::mutex mu;
  std::vector<std::string> problems;
  auto statuses = world.run([&](comm::Comm& c) -> Status {
    at::set_num_threads(1);
    PathRunner runner(c.shared_from_this());
    LOOM_TRY(runner.add_groups({&*path}));
    const int64_t rank = c.world_rank().value();
    at::Tensor x = cut_piece(full, from.piece(position(from, rank), TensorId(0), shape));
    LOOM_ASSIGN_OR_RETURN(at::Tensor plain, runner.run(*path, shape, x, PathPart::kAll, 0));
    LOOM_ASSIGN_OR_RETURN(at::Tensor ragged,
                          runner.run(*path, shape, x, PathPart::kAll, 10, at::kFloat, 2));
    LOOM_TRY(runner.flush());
    const at::Tensor want = cut_piece(full, to.piece(position(to, rank), TensorId(0), shape));
    std::lock_guard<std::mutex> lock(mu);
    if (!at::equal(plain, want)) problems.push_back("plain, rank " + std::to_string(rank));
    if (!at::equal(ragged, want)) problems.push_back("ragged, rank " + std::to_string(rank));
    return Status::success();
  });
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(statuses[r].ok()) << statuses[r].error().message;
  EXPECT_TRUE(problems.empty()) << problems.size() << " wrong pieces, first: " << problems[0];
}

}  // namespace
}  // namespace loom::runtime
