// The validator rejects missing, duplicated, misordered and deadlocking schedules, naming blocks.
#include "scheduler/validator.h"

#include <gtest/gtest.h>

#include "scheduler/predefined.h"
#include "scheduler/simulator.h"

namespace loom::sched {
namespace {

struct Fixture {
  Workload w;
  std::vector<std::vector<BlockId>> order;
};

Fixture one_f_one_b_4x4() {
  auto s = one_f_one_b(PipelineSpec::of(4, 4));
  EXPECT_TRUE(s.ok());
  return {s->workload(), s->device_orders()};
}

std::string rejection(const Fixture& f) {
  auto r = Schedule::create(f.w, f.order);
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : r.error().message;
}

TEST(Validator, AcceptsPredefined) {
  Fixture f = one_f_one_b_4x4();
  EXPECT_TRUE(Schedule::create(f.w, f.order).ok());
}

// A schedule re-timed in place (Schedule::with_durations) equals the one rebuilt and validated
// from its blocks at the new durations; a negative duration is refused as create refuses it.
TEST(Validator, WithDurationsEqualsTheRebuiltSchedule) {
  auto s = zb_h1(PipelineSpec::of(4, 8));
  ASSERT_TRUE(s.ok()) << s.error().message;
  auto time_of = [](const Block& b) { return b.kind == BlockKind::kF ? 2.5 : 1.25; };
  std::vector<Block> blocks = s->workload().blocks();
  std::vector<std::vector<int>> deps;
  for (int i = 0; i < s->workload().size(); ++i) deps.push_back(s->workload().deps(i));
  for (Block& b : blocks) b.duration = time_of(b);
  auto w = Workload::create(s->num_devices(), std::move(blocks), std::move(deps));
  ASSERT_TRUE(w.ok()) << w.error().message;
  auto rebuilt = Schedule::from_indices(std::move(w).value(), s->order(), s->name());
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.error().message;
  auto retimed = s->with_durations(time_of);
  ASSERT_TRUE(retimed.ok()) << retimed.error().message;
  EXPECT_EQ(*retimed, *rebuilt);
  EXPECT_EQ(retimed->name(), rebuilt->name());
  EXPECT_EQ(simulate(*retimed)->makespan, simulate(*rebuilt)->makespan);
  EXPECT_FALSE(s->with_durations([](const Block&) { return -1.0; }).ok());
}

TEST(Validator, MissingBlock) {
  Fixture f = one_f_one_b_4x4();
  auto& d1 = f.order[1];
  d1.erase(std::find(d1.begin(), d1.end(), BlockId::of(1, BlockKind::kB, 2)));
  EXPECT_EQ(rejection(f), "block 1B2 (stage 1, micro-batch 2, B) is missing from device 1's order");
}

TEST(Validator, DuplicatedBlock) {
  Fixture f = one_f_one_b_4x4();
  f.order[0].push_back(BlockId::of(0, BlockKind::kF, 1));
  EXPECT_EQ(rejection(f), "block 0F1 (stage 0, micro-batch 1, F) appears twice on device 0");
}

TEST(Validator, UnknownAndMisplacedBlock) {
  Fixture f = one_f_one_b_4x4();
  f.order[0].push_back(BlockId::of(9, BlockKind::kF, 0));
  EXPECT_EQ(rejection(f),
            "device 0 runs 9F0 (stage 9, micro-batch 0, F), which is not a block of this pipeline");
  f = one_f_one_b_4x4();
  f.order[0].push_back(BlockId::of(1, BlockKind::kF, 0));
  EXPECT_EQ(
      rejection(f),
      "block 1F0 (stage 1, micro-batch 0, F) is ordered on device 0 but runs on other devices");
}

TEST(Validator, SameDeviceDependency) {
  Fixture f = one_f_one_b_4x4();
  auto& d3 = f.order[3];  // last stage: F0 B0 F1 B1 ...: swap F0 and B0
  std::swap(d3[0], d3[1]);
  EXPECT_EQ(rejection(f),
            "block 3B0 (stage 3, micro-batch 0, B) runs before its dependency 3F0 on device 3");
}

TEST(Validator, CrossDeviceDeadlock) {
  Fixture f = one_f_one_b_4x4();
  // Device 0 runs 0B0 right after 0F0 and device 3 runs 3F1 before 3B0: 0B0 waits (through
  // 1B0, 2B0) for 3B0, which waits for 3F1, which waits (through 2F1, 1F1) for 0F1, which
  // device 0 runs after 0B0.
  auto& d0 = f.order[0];
  d0.erase(std::find(d0.begin(), d0.end(), BlockId::of(0, BlockKind::kB, 0)));
  d0.insert(d0.begin() + 1, BlockId::of(0, BlockKind::kB, 0));
  std::swap(f.order[3][1], f.order[3][2]);
  std::string msg = rejection(f);
  EXPECT_NE(msg.find("deadlocks"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0B0 (device 0)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3F1 (device 3)"), std::string::npos) << msg;
}

TEST(Validator, SimulatorReportsDeadlockToo) {
  // A multi-device block ordered differently on its two devices deadlocks.
  std::vector<Block> blocks(2);
  blocks[0] = Block{StageId(0), MicroBatch(0), BlockKind::kF, {DeviceId(0), DeviceId(1)}, 1, 0, ""};
  blocks[1] = Block{StageId(1), MicroBatch(0), BlockKind::kF, {DeviceId(0), DeviceId(1)}, 1, 0, ""};
  auto w = Workload::create(2, blocks, {{}, {}});
  ASSERT_TRUE(w.ok());
  auto s =
      Schedule::create(*w, {{blocks[0].id(), blocks[1].id()}, {blocks[1].id(), blocks[0].id()}});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("deadlocks"), std::string::npos);
}

TEST(Validator, WorkloadRejectsBadInput) {
  std::vector<Block> blocks(1);
  blocks[0] = Block{StageId(0), MicroBatch(0), BlockKind::kF, {DeviceId(3)}, 1, 0, ""};
  auto w = Workload::create(2, blocks, {{}});
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().message,
            "block 0F0 (stage 0, micro-batch 0, F) runs on device 3, outside 0..1");
}

}  // namespace
}  // namespace loom::sched
