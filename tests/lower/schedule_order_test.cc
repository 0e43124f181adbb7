// parallel.schedule search on the stage costs of a plan: the search's block graph carries each
// pipeline device's own durations and memory, the found schedule comes back at the exact
// durations, a tight device memory keeps fewer micro-batches in flight, and one that cannot hold
// a single micro-batch is an error naming parallel.schedule.
#include "lower/schedule_order.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "scheduler/csv.h"
#include "scheduler/predefined.h"
#include "scheduler/simulator.h"
#include "tests/support/plan_chain.h"

namespace loom::lower {
namespace {

constexpr double kGiB = 1ull << 30;

Config search_config(int pp, int micro_batches, const std::string& schedule = "search") {
  auto c = parse_config("model: {type: gpt, preset: tiny}\nparallel: {pp: " + std::to_string(pp) +
                            ", schedule: " + schedule +
                            "}\nbatch: {global: " + std::to_string(micro_batches) + ", micro: 1}\n",
                        "s.yaml");
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

// Four stages, the third twice as slow as the others; every device has 10 GiB of room for
// activations (16 GiB less 6 GiB held) and a micro-batch's activations take `act_gib`.
StageCosts four_stages(double act_gib, double device_gib = 16) {
  StageCosts costs;
  costs.device_memory_bytes = device_gib * kGiB;
  for (double f : {1e-3, 1e-3, 2e-3, 1e-3})
    costs.devices.push_back(StageCost{f, act_gib * kGiB, 6 * kGiB});
  return costs;
}

TEST(SearchPlacement, BlocksCarryEachStagesDurationAndMemory) {
  const Config c = search_config(4, 8);
  auto placement =
      search_placement(c.parallel.pp, c.parallel.schedule == "search-zb", four_stages(2.5));
  ASSERT_TRUE(placement.ok()) << placement.error().message;
  EXPECT_DOUBLE_EQ(placement->memory_limit(), 1.0);  // memory as shares of each device's room
  for (const sched::PlacedBlock& b : placement->blocks()) {
    const double f = b.devices[0].value() == 2 ? 1.0 : 0.5;  // in slowest forwards
    EXPECT_DOUBLE_EQ(b.span, b.kind == sched::BlockKind::kF ? f : 2 * f) << b.name;
    EXPECT_DOUBLE_EQ(b.memory, b.kind == sched::BlockKind::kF ? 0.25 : -0.25) << b.name;
  }
}

// search-zb: ZB-H1's placement; I and W take a forward each (I also the recomputed forward's
// share) and W, not I, releases the activations.
TEST(SearchPlacement, SearchZbSplitsEachBackwardIntoIAndW) {
  const Config c = search_config(4, 8, "search-zb");
  StageCosts costs = four_stages(2.5);
  costs.devices[1].recompute_s = 0.5e-3;
  auto placement = search_placement(c.parallel.pp, c.parallel.schedule == "search-zb", costs);
  ASSERT_TRUE(placement.ok()) << placement.error().message;
  EXPECT_EQ(placement->blocks().size(), 12u);
  for (const sched::PlacedBlock& b : placement->blocks()) {
    const int d = static_cast<int>(b.devices[0].value());
    const double f = d == 2 ? 1.0 : 0.5, again = d == 1 ? 0.25 : 0.0;
    EXPECT_NE(b.kind, sched::BlockKind::kB) << b.name;
    EXPECT_DOUBLE_EQ(b.span, b.kind == sched::BlockKind::kI ? f + again : f) << b.name;
    EXPECT_DOUBLE_EQ(b.memory, b.kind == sched::BlockKind::kF   ? 0.25
                               : b.kind == sched::BlockKind::kW ? -0.25
                                                                : 0.0)
        << b.name;
  }
  auto uniform = search_placement(c.parallel.pp, c.parallel.schedule == "search-zb", {});
  ASSERT_TRUE(uniform.ok());
  EXPECT_EQ(*uniform, sched::Placement::v_shape_split(4));
}

// Each rank of a search-zb pipeline runs one F, one I and one W per micro-batch, and the plan's
// schedule is at the stage costs (I and W a forward each).
TEST(PipelineOrder, SearchZbGivesEachRankFIAndWBlocks) {
  const Config c = search_config(2, 4, "search-zb");
  StageCosts costs;
  for (double f : {1e-3, 1e-3}) costs.devices.push_back(StageCost{f, 0.1 * kGiB, 1 * kGiB});
  costs.device_memory_bytes = 16 * kGiB;
  for (const StageCosts& with : {StageCosts{}, costs}) {
    auto order = testing_support::pipeline_order_of(c, 4, with);
    ASSERT_TRUE(order.ok()) << order.error().message;
    ASSERT_EQ(order->ranks.size(), 2u);
    for (int r = 0; r < 2; ++r) {
      std::map<std::pair<BlockKind, int64_t>, int> seen;
      for (const ProgramBlock& b : order->ranks[static_cast<size_t>(r)]) {
        EXPECT_EQ(b.stage, StageId(r));
        ++seen[{b.kind, b.micro_batch.value()}];
      }
      EXPECT_EQ(seen.size(), 3u * 4u);
      for (BlockKind k : {BlockKind::kF, BlockKind::kI, BlockKind::kW})
        for (int64_t mb = 0; mb < 4; ++mb)
          EXPECT_EQ((seen[{k, mb}]), 1) << "rank " << r << " micro-batch " << mb;
    }
    ASSERT_NE(order->schedule, nullptr);
    for (const sched::Block& b : order->schedule->workload().blocks())
      EXPECT_EQ(b.memory, b.kind == sched::BlockKind::kF   ? 1.0
                          : b.kind == sched::BlockKind::kW ? -1.0
                                                           : 0.0)
          << b.to_string();
  }
}

TEST(SearchPlacement, WithoutCostsKeepsPpMicroBatchesInFlight) {
  const Config c = search_config(4, 8);
  auto uniform = search_placement(c.parallel.pp, c.parallel.schedule == "search-zb", {});
  ASSERT_TRUE(uniform.ok());
  EXPECT_EQ(*uniform, sched::Placement::v_shape(4));
  // Durations but no device memory: one micro-batch per F, at most pp of them.
  StageCosts no_memory = four_stages(2.5);
  no_memory.device_memory_bytes = 0;
  auto p = search_placement(c.parallel.pp, c.parallel.schedule == "search-zb", no_memory);
  ASSERT_TRUE(p.ok());
  EXPECT_DOUBLE_EQ(p->memory_limit(), 4.0);
  for (const sched::PlacedBlock& b : p->blocks())
    EXPECT_DOUBLE_EQ(std::abs(b.memory), 1.0) << b.name;
}

// The found schedule runs each block at its stage's cost-model duration (ms) exactly.
TEST(PipelineOrder, TheSearchedScheduleHasTheStageCostsDurations) {
  const Config c = search_config(4, 8);
  const StageCosts costs = four_stages(1.0);
  auto order = testing_support::pipeline_order_of(c, 8, costs);
  ASSERT_TRUE(order.ok()) << order.error().message;
  ASSERT_NE(order->schedule, nullptr);
  const sched::Schedule& s = *order->schedule;
  EXPECT_EQ(s.workload().size(), 4 * 8 * 2);
  for (const sched::Block& b : s.workload().blocks()) {
    const double f_ms = costs.devices[static_cast<size_t>(b.stage.value())].forward_s * 1e3;
    EXPECT_EQ(b.duration, b.kind == sched::BlockKind::kF ? f_ms : 2 * f_ms) << b.to_string();
    EXPECT_EQ(b.memory, b.kind == sched::BlockKind::kF ? 1.0 : -1.0) << b.to_string();
  }
  // Its orders are what every rank runs.
  ASSERT_EQ(order->ranks.size(), 4u);
  for (int d = 0; d < 4; ++d) {
    const auto blocks = s.device_order(DeviceId(d));
    ASSERT_EQ(order->ranks[static_cast<size_t>(d)].size(), blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      EXPECT_EQ(order->ranks[static_cast<size_t>(d)][i].stage, blocks[i].stage);
      EXPECT_EQ(order->ranks[static_cast<size_t>(d)][i].micro_batch, blocks[i].mb);
    }
  }
  // The slow stage bounds the step: 8 micro-batches of its 2 + 4 ms, after the first two
  // forwards (1 ms each) and before the last two backwards (2 ms each). The search meets it.
  auto t = sched::simulate(s);
  ASSERT_TRUE(t.ok());
  EXPECT_DOUBLE_EQ(t->makespan, 8 * 6.0 + 2 * 1.0 + 2 * 2.0);
}

// 10 GiB of room and 4 GiB per micro-batch: two in flight at most on every device, where 1F1B
// keeps four on device 0 and the unconstrained search more.
TEST(PipelineOrder, ATightDeviceMemoryKeepsFewerMicroBatchesInFlight) {
  const Config c = search_config(4, 8);
  auto ample = testing_support::pipeline_order_of(c, 8, four_stages(0.1));
  auto tight = testing_support::pipeline_order_of(c, 8, four_stages(4.0));
  ASSERT_TRUE(ample.ok() && tight.ok()) << (tight.ok() ? ample : tight).error().message;
  auto ample_t = sched::simulate(*ample->schedule);
  auto tight_t = sched::simulate(*tight->schedule);
  ASSERT_TRUE(ample_t.ok() && tight_t.ok());
  EXPECT_GE(ample_t->max_peak_memory(), 4.0);
  for (double peak : tight_t->peak_memory) EXPECT_LE(peak, 2.0);
  EXPECT_GT(tight_t->makespan, ample_t->makespan);  // memory costs time here
}

TEST(PipelineOrder, NoRoomForOneMicroBatchNamesTheKeyAndTheNumbers) {
  const Config c = search_config(4, 8);
  StageCosts costs = four_stages(1.0);
  costs.devices[3].held_bytes = 15.5 * kGiB;  // 0.5 GiB left of 16, a micro-batch needs 1
  auto order = testing_support::pipeline_order_of(c, 8, costs);
  ASSERT_FALSE(order.ok());
  const std::string& msg = order.error().message;
  EXPECT_NE(msg.find("parallel.schedule"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pipeline device 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("16 GiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("15.5 GiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0.5 GiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cost.device_memory_bytes"), std::string::npos) << msg;
}

// Predefined schedules ignore the stage costs: their orders are their rules'.
TEST(PipelineOrder, PredefinedOrdersIgnoreTheStageCosts) {
  Config c = search_config(4, 8);
  c.parallel.schedule = "1f1b";
  auto with = testing_support::pipeline_order_of(c, 8, four_stages(4.0));
  auto without = testing_support::pipeline_order_of(c, 8);
  ASSERT_TRUE(with.ok() && without.ok());
  ASSERT_NE(with->schedule, nullptr);  // the rule's schedule, at a forward of 1
  EXPECT_EQ(with->schedule->name(), "1f1b");
  auto rule = sched::device_orders(sched::ScheduleKind::k1F1B, 4, 8, 1);
  ASSERT_TRUE(rule.ok());
  for (size_t d = 0; d < 4; ++d) {
    ASSERT_EQ(with->ranks[d].size(), (*rule)[d].size());
    ASSERT_EQ(without->ranks[d].size(), (*rule)[d].size());
    for (size_t i = 0; i < (*rule)[d].size(); ++i) {
      EXPECT_EQ(with->ranks[d][i].stage, (*rule)[d][i].stage);
      EXPECT_EQ(with->ranks[d][i].micro_batch, (*rule)[d][i].mb);
      EXPECT_EQ(without->ranks[d][i].micro_batch, (*rule)[d][i].mb);
    }
  }
}

// zb-h1 runs: each rank's order is its pipeline device's F, I and W blocks, one to one.
TEST(PipelineOrder, ZbH1MapsItsSplitBackward) {
  auto c = parse_config(
      "model: {type: gpt, preset: tiny}\nparallel: {pp: 2, schedule: zb-h1}\n"
      "batch: {global: 4, micro: 1}\n",
      "z.yaml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto order = testing_support::pipeline_order_of(*c, 4);
  ASSERT_TRUE(order.ok()) << order.error().message;
  auto expected = sched::device_orders(sched::ScheduleKind::kZbH1, 2, 4);
  ASSERT_TRUE(expected.ok());
  ASSERT_EQ(order->ranks.size(), 2u);
  for (size_t r = 0; r < 2; ++r) {
    const auto& want = (*expected)[r];
    ASSERT_EQ(order->ranks[r].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(order->ranks[r][i].kind, want[i].kind) << want[i].describe();
      EXPECT_EQ(order->ranks[r][i].stage, want[i].stage);
      EXPECT_EQ(order->ranks[r][i].micro_batch, want[i].mb);
    }
  }
}

// parallel.schedule csv: each rank runs its row of the file, checked against the plan.
class CsvOrder : public testing::Test {
 protected:
  // A config with pp pipeline ranks, `chunks` stages each and m micro-batches per step,
  // running the CSV `text`.
  Config config(const std::string& text, int pp, int m, int chunks = 1) {
    file_ = std::filesystem::path(testing::TempDir()) /
            ("loom_csv_" +
             std::string(testing::UnitTest::GetInstance()->current_test_info()->name()) + ".csv");
    std::ofstream(file_) << text;
    auto c = parse_config(
        "model: {type: gpt, preset: tiny}\n", "c.yaml",
        {"parallel.pp=" + std::to_string(pp), "parallel.chunks=" + std::to_string(chunks),
         "parallel.schedule=csv", "parallel.schedule_csv=" + file_.string(),
         "batch.global=" + std::to_string(m), "batch.micro=1"});
    EXPECT_TRUE(c.ok()) << c.error().message;
    return *c;
  }
  std::string refused(const std::string& text, int pp, int m, int chunks = 1) {
    auto o = testing_support::pipeline_order_of(config(text, pp, m, chunks), m);
    EXPECT_FALSE(o.ok());
    return o.ok() ? "" : o.error().message;
  }
  std::filesystem::path file_;
};

TEST_F(CsvOrder, ExportedInterleavedRunsThePredefinedOrder) {
  auto s = sched::interleaved_1f1b(sched::PipelineSpec::of(2, 4, 2));
  auto csv = sched::to_csv(*s);
  ASSERT_TRUE(csv.ok());
  auto o = testing_support::pipeline_order_of(config(*csv, 2, 4, 2), 4);
  ASSERT_TRUE(o.ok()) << o.error().message;
  auto rule = sched::device_orders(sched::ScheduleKind::kInterleaved, 2, 4, 2);
  ASSERT_TRUE(rule.ok());
  for (size_t d = 0; d < 2; ++d) {
    ASSERT_EQ(o->ranks[d].size(), (*rule)[d].size());
    for (size_t i = 0; i < (*rule)[d].size(); ++i) {
      EXPECT_EQ(o->ranks[d][i].stage, (*rule)[d][i].stage);
      EXPECT_EQ(o->ranks[d][i].micro_batch, (*rule)[d][i].mb);
      EXPECT_EQ(o->ranks[d][i].kind == BlockKind::kF, (*rule)[d][i].kind == sched::BlockKind::kF);
    }
  }
}

TEST_F(CsvOrder, ShapeMismatchesNameTheKeysAndNumbers) {
  const std::string pp2 = "0F0,0F1,,0B0,,0B1\n,1F0,1B0,1F1,1B1,\n";
  std::string rows = refused(pp2, 4, 2);
  EXPECT_NE(rows.find("parallel.schedule_csv: " + file_.string() +
                      ": the schedule has 2 rows (ranks), parallel.pp is 4"),
            std::string::npos)
      << rows;
  std::string stages = refused(pp2, 2, 2, 2);
  EXPECT_NE(stages.find("the schedule has 2 stages, parallel.pp x parallel.chunks is 2 x 2 = 4"),
            std::string::npos)
      << stages;
  std::string mbs = refused(pp2, 2, 4);
  EXPECT_NE(mbs.find("the schedule has 2 micro-batches, a step has 4 (batch.global 4 / "
                     "(batch.micro 1 x parallel.dp 1))"),
            std::string::npos)
      << mbs;
}

TEST_F(CsvOrder, FileErrorsNameTheKeyTheFileAndTheCell) {
  std::string bad = refused("0F0,0F1,,0B0,,0Q1\n,1F0,1B0,1F1,1B1,\n", 2, 2);
  EXPECT_NE(bad.find("parallel.schedule_csv: " + file_.string() + ": row 1, column 6: '0Q1'"),
            std::string::npos)
      << bad;
  Config c = config("", 2, 2);
  c.parallel.schedule_csv = "/nonexistent/s.csv";
  auto missing = testing_support::pipeline_order_of(c, 2);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find(
                "parallel.schedule_csv: cannot read schedule file '/nonexistent/s.csv'"),
            std::string::npos)
      << missing.error().message;
}

TEST_F(CsvOrder, StagesMustSitWhereThePlannerPutsThem) {
  // A V-shape (stage 3 on rank 0) is a fine schedule, but the planner loops stages over ranks.
  std::string v = refused(
      "0F0,0F1,,,3F0,3B0,,,3F1,3B1,,,0B0,0B1\n,1F0,2F0,1F1,2F1,,,2B0,1B0,,2B1,1B1,,\n", 2, 2, 2);
  EXPECT_NE(v.find("row 1, column 5: block 3F0 runs on row 1, but the planner places stage 3 on "
                   "pipeline rank 1 (row 2): stage s runs on rank s mod parallel.pp"),
            std::string::npos)
      << v;
}

TEST_F(CsvOrder, SplitBackwardRunsAsIAndWBlocks) {
  auto zb = sched::zb_h1(sched::PipelineSpec::of(2, 2));
  ASSERT_TRUE(zb.ok());
  auto o = testing_support::pipeline_order_of(config(*sched::to_csv(*zb), 2, 2), 2);
  ASSERT_TRUE(o.ok()) << o.error().message;
  const auto rule = zb->device_orders();
  for (size_t d = 0; d < 2; ++d) {
    ASSERT_EQ(o->ranks[d].size(), rule[d].size());
    for (size_t i = 0; i < rule[d].size(); ++i)
      EXPECT_EQ(o->ranks[d][i].kind, rule[d][i].kind) << rule[d][i].describe();
  }
}

}  // namespace
}  // namespace loom::lower
