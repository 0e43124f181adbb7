// CSV round trips, rendering, and placement files.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "scheduler/csv.h"
#include "scheduler/placement.h"
#include "scheduler/predefined.h"
#include "scheduler/render.h"
#include "scheduler/repetend.h"
#include "scheduler/simulator.h"

namespace loom::sched {
namespace {

TEST(Csv, RoundTripEveryPredefinedSchedule) {
  for (const auto& name : schedule_kind_names()) {
    ScheduleKind kind = *parse_schedule_kind(name);
    PipelineSpec spec = PipelineSpec::of(
        4, 8, kind == ScheduleKind::kInterleaved || kind == ScheduleKind::kLoopedBfs ? 2 : 1);
    auto s = build_predefined(kind, spec);
    ASSERT_TRUE(s.ok()) << name;
    auto csv = to_csv(*s);
    ASSERT_TRUE(csv.ok()) << csv.error().to_string();
    CsvImportOptions opt;
    opt.fwd = spec.fwd, opt.bwd = spec.bwd, opt.wgrad = spec.wgrad;
    auto back = from_csv(*csv, opt);
    ASSERT_TRUE(back.ok()) << name << ": " << back.error().to_string();
    EXPECT_EQ(*back, *s) << name;
    EXPECT_EQ(*to_csv(*back), *csv) << name;
  }
}

TEST(Csv, CellsAndIdleSteps) {
  auto s = one_f_one_b(PipelineSpec::of(2, 2));
  auto csv = to_csv(*s);
  ASSERT_TRUE(csv.ok());
  // Unit steps: rank 1 idles until 0F0 is done; rank 0 idles while rank 1 runs 1B0 and 1B1.
  EXPECT_EQ(*csv, "0F0,0F1,,0B0,,0B1\n,1F0,1B0,1F1,1B1,\n");
}

// The message of a CSV that must be refused.
std::string refused(const std::string& csv) {
  auto s = from_csv(csv);
  EXPECT_FALSE(s.ok()) << csv;
  return s.ok() ? "" : s.error().message;
}

TEST(Csv, ImportErrorsNameTheCell) {
  EXPECT_EQ(refused("0F0,0X1\n"),
            "row 1, column 2: '0X1' is not a block: expected STAGE KIND MICROBATCH such as 0F0, "
            "1B3, 2I1, 2W1");
  EXPECT_EQ(refused("0F0,0B0,(0F1;0B1\n"),
            "row 1, column 3: '(0F1;0B1' opens '(' without closing it; a composite cell is "
            "written (0F7;7B3)OVERLAP_F_B");
  EXPECT_EQ(refused("0F0,0B0,(0F1;0B1)OVERLAP\n"),
            "row 1, column 3: '(0F1;0B1)OVERLAP' is a composite cell of an unknown kind; "
            "expected (0F7;7B3)OVERLAP_F_B");
  EXPECT_EQ(refused("0F0,(0F1;;0B1)OVERLAP_F_B,0B0\n"),
            "row 1, column 2: '(0F1;;0B1)OVERLAP_F_B' has an empty action; a composite cell is "
            "written (0F7;7B3)OVERLAP_F_B");
  EXPECT_EQ(refused("0F0,0F1,0B0,0F1,0B1\n"),
            "row 1, column 4: block 0F1 (stage 0, micro-batch 1, F) is listed twice (first at "
            "row 1, column 2); ranks that run a block together list it in one column");
  EXPECT_EQ(refused("0F0,0B0\n\n1F0\n"),
            "row 2 is blank: every row is a rank (a rank that idles has a row of empty cells)");
  EXPECT_EQ(refused("\n\n"), "the schedule has no rows");
}

TEST(Csv, MissingBlockNamesTheRowThatShouldRunIt) {
  EXPECT_EQ(refused("0F0,0F1,0B0\n,1F0,1B0,1F1,1B1\n"),
            "block 0B1 (stage 0, micro-batch 1, B) is missing: row 1, which runs stage 0 for "
            "micro-batch 1, does not list it");
  EXPECT_EQ(refused("0F0,,,,0B0\n,,,,\n,,2F0,2B0,\n"),
            "block 1F0 (stage 1, micro-batch 0, F) is missing: no row runs stage 1 (the schedule "
            "names stages 0..2)");
  EXPECT_EQ(refused("0F0,0I0\n"),
            "block 0W0 (stage 0, micro-batch 0, W) is missing: row 1, which runs stage 0 for "
            "micro-batch 0, does not list it");
}

TEST(Csv, BlockOffItsStagesRank) {
  // Stage 1 runs on rank 1 for every micro-batch but one backward.
  EXPECT_EQ(refused("0F0,0F1,,,0B0,1B1,0B1\n,1F0,1F1,1B0,,,\n"),
            "row 1, column 6: block 1B1 (stage 1, micro-batch 1, B) runs on row 1, but stage 1 "
            "runs on row 2");
}

TEST(Csv, BrokenDependencyNamesTheFirstBlockThatCannotStart) {
  // Rank 1 lists 1B0 before the 1F0 it depends on.
  EXPECT_EQ(refused("0F0,,,0B0\n,1B0,1F0,\n"),
            "row 2, column 2: block 1B0 waits for 1F0, which its row runs later (row 2, column "
            "3): it can never start");
}

TEST(Csv, DeadlockNamesWhereEachRankWaits) {
  EXPECT_EQ(refused("0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n"),
            "the schedule deadlocks: row 1, column 2 (0B0) waits for 1B0 (row 2, column 3); "
            "row 2, column 1 (1F1) waits for 0F1 (row 1, column 3)");
}

TEST(Csv, CompositeCellsRunTheirActionsInOrder) {
  // 1F1B with the steady state's forward and backward written as one overlapped cell each.
  auto s = from_csv(
      "0F0,0F1,,(0F2;0B0)OVERLAP_F_B,,(0F3;0B1)OVERLAP_F_B,,0B2,,0B3\n"
      ",1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3,\n");
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->to_string(),
            "d0: 0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3\n"
            "d1: 1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3\n");
  // Whitespace around cells and actions, and a Windows line end, change nothing.
  auto spaced = from_csv(
      " 0F0 , 0F1 ,, ( 0F2 ; 0B0 )OVERLAP_F_B ,,(0F3;0B1)OVERLAP_F_B,,0B2,,0B3\r\n"
      ",1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3,\r\n");
  ASSERT_TRUE(spaced.ok()) << spaced.error().message;
  EXPECT_EQ(*spaced, *s);
}

TEST(Csv, InfersLoopedAndVShapedPlacements) {
  // Looped: stage s on rank s mod 2 (interleaved 1F1B exports it).
  auto looped = interleaved_1f1b(PipelineSpec::of(2, 4, 2));
  auto back = from_csv(*to_csv(*looped));
  ASSERT_TRUE(back.ok()) << back.error().message;
  for (const Block& b : back->workload().blocks())
    EXPECT_EQ(b.devices, std::vector<DeviceId>{DeviceId(b.stage.value() % 2)}) << b.to_string();
  // V-shape: stages 0 and 3 on rank 0, 1 and 2 on rank 1.
  auto vshape = from_csv(
      "0F0,0F1,,,3F0,3B0,,,3F1,3B1,,,0B0,0B1\n"
      ",1F0,2F0,1F1,2F1,,,2B0,1B0,,2B1,1B1,,\n");
  ASSERT_TRUE(vshape.ok()) << vshape.error().message;
  for (const Block& b : vshape->workload().blocks()) {
    const int64_t s = b.stage.value();
    EXPECT_EQ(b.devices, std::vector<DeviceId>{DeviceId(s < 2 ? s : 3 - s)}) << b.to_string();
  }
  auto t = simulate(*vshape);
  ASSERT_TRUE(t.ok());
  EXPECT_GT(t->makespan, 0);
}

TEST(Csv, SplitAndFullBackwardsMixPerMicroBatch) {
  // Micro-batch 0 runs a full backward, micro-batch 1 an input-gradient then a deferred weight
  // gradient; W releases the activations that I keeps.
  auto s = from_csv("0F0,0F1,,0B0,,0I1,0W1\n,1F0,1B0,1F1,1I1,1W1,\n");
  ASSERT_TRUE(s.ok()) << s.error().message;
  const Workload& w = s->workload();
  EXPECT_EQ(w.block(*w.find(BlockId::of(0, BlockKind::kI, 1))).memory, 0);
  EXPECT_EQ(w.block(*w.find(BlockId::of(0, BlockKind::kW, 1))).memory, -1);
  auto t = simulate(*s);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->peak_memory[0], 2.0);
  // One micro-batch's backward at one stage is one or the other.
  EXPECT_EQ(refused("0F0,0B0,0I0,0W0\n"),
            "row 1, column 3: block 0I0 and 0B0 (at row 1, column 2) both run the backward of "
            "stage 0, micro-batch 0; a backward is either B or I + W");
}

TEST(Csv, SaysWhichNamesTheFileUses) {
  auto full = read_csv(*to_csv(*one_f_one_b(PipelineSpec::of(2, 4))));
  ASSERT_TRUE(full.ok()) << full.error().message;
  EXPECT_EQ(full->actions, CsvActions::kFullBackward);
  auto split = read_csv(*to_csv(*zb_h1(PipelineSpec::of(2, 4))));
  ASSERT_TRUE(split.ok()) << split.error().message;
  EXPECT_EQ(split->actions, CsvActions::kInputWeight);
}

// torch.distributed.pipelining's files from before it named the input gradient I write it B: a
// B followed by a W of the same stage and micro-batch is I + W there, a lone B a full backward.
TEST(Csv, ReadsTorchsOlderBackwardWeightNames) {
  const PipelineSpec spec = PipelineSpec::of(2, 4);
  auto zb = zb_h1(spec);
  std::string older = *to_csv(*zb);
  std::replace(older.begin(), older.end(), 'I', 'B');
  CsvImportOptions opt;
  opt.fwd = spec.fwd, opt.bwd = spec.bwd, opt.wgrad = spec.wgrad;
  auto r = read_csv(older, opt);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->actions, CsvActions::kBackwardWeight);
  EXPECT_EQ(r->schedule, *zb);
  // Micro-batch 0 with a full backward, micro-batch 1 split: the same schedule as the current
  // names write it.
  auto mixed = read_csv("0F0,0F1,,0B0,,0B1,0W1\n,1F0,1B0,1F1,1B1,1W1,\n");
  ASSERT_TRUE(mixed.ok()) << mixed.error().message;
  EXPECT_EQ(mixed->actions, CsvActions::kBackwardWeight);
  EXPECT_EQ(mixed->schedule, *from_csv("0F0,0F1,,0B0,,0I1,0W1\n,1F0,1B0,1F1,1I1,1W1,\n"));
  // An error names the blocks as loom reads them and says how the file was read.
  EXPECT_EQ(refused("0F0,0W0,0B0\n"),
            "row 1, column 2: block 0W0 waits for 0I0, which its row runs later (row 1, column "
            "3): it can never start (the file writes torch's older action names: a B followed "
            "by a W of the same stage and micro-batch is read as I + W)");
  // A file that writes I uses the current names: B and W of one micro-batch stay a mistake.
  EXPECT_EQ(refused("0F0,0B0,0W0,0F1,0I1,0W1\n"),
            "row 1, column 3: block 0W0 and 0B0 (at row 1, column 2) both run the backward of "
            "stage 0, micro-batch 0; a backward is either B or I + W");
}

TEST(Csv, BlocksSeveralRanksRunTogetherShareAColumn) {
  // What to_csv writes for a block on two devices (a tensor-parallel stage): one column.
  auto s = from_csv("0F0,1F0,1B0,0B0\n,1F0,1B0,\n");
  ASSERT_TRUE(s.ok()) << s.error().message;
  const Workload& w = s->workload();
  EXPECT_EQ(w.block(*w.find(BlockId::of(1, BlockKind::kF, 0))).devices,
            (std::vector<DeviceId>{DeviceId(0), DeviceId(1)}));
}

TEST(Csv, ReadCsvKeepsEachBlocksCell) {
  auto r = read_csv("0F0,,(0F1;0B0)OVERLAP_F_B,0B1\n,1F0,1B0,1F1,1B1\n");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->num_stages, 2);
  EXPECT_EQ(r->micro_batches, 2);
  const Workload& w = r->schedule.workload();
  EXPECT_EQ(r->cells[static_cast<size_t>(*w.find(BlockId::of(0, BlockKind::kB, 0)))],
            (CsvCell{1, 3}));
  EXPECT_EQ(r->cells[static_cast<size_t>(*w.find(BlockId::of(1, BlockKind::kB, 1)))],
            (CsvCell{2, 5}));
}

TEST(Render, ChromeTraceParsesBack) {
  auto s = interleaved_1f1b(PipelineSpec::of(2, 4, 2));
  auto t = simulate(*s);
  auto doc = nlohmann::json::parse(to_chrome_trace(*s, *t));
  int slices = 0, counters = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X") {
      ++slices;
      EXPECT_TRUE(e.contains("ts") && e.contains("dur") && e.contains("pid") && e.contains("name"));
      EXPECT_LT(e["pid"].get<int>(), 2);
    }
    if (e["ph"] == "C") {
      ++counters;
      EXPECT_TRUE(e["args"].contains("activations"));
    }
  }
  EXPECT_EQ(slices, s->workload().size());
  EXPECT_GT(counters, 0);
  bool named = false;
  for (const auto& e : doc["traceEvents"]) named |= e["name"] == "F s1 mb3";
  EXPECT_TRUE(named);
}

TEST(Render, SvgHasOneRectPerBlockAndDevice) {
  auto s = search_schedule(Placement::m_shape(4), 4);
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  std::string svg = to_svg(s->schedule, s->timeline);
  size_t rects = 0, pos = 0;
  while ((pos = svg.find("<rect class=\"block\"", pos)) != std::string::npos) ++rects, ++pos;
  size_t expected = 0;
  for (const auto& dev : s->schedule.order()) expected += dev.size();
  EXPECT_EQ(rects, expected);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST(Placement, ShippedFilesLoadAndMatchTheGenerators) {
  const std::string dir = std::string(LOOM_SOURCE_DIR) + "/configs/placements/";
  struct Shipped {
    const char* file;
    Placement generated;
  };
  for (const auto& [file, generated] : {Shipped{"v_shape.yaml", Placement::v_shape(4)},
                                        Shipped{"x_shape.yaml", Placement::x_shape(4)},
                                        Shipped{"m_shape.yaml", Placement::m_shape(4)},
                                        Shipped{"k_shape.yaml", Placement::k_shape(4)}}) {
    auto pl = Placement::load(dir + file);
    ASSERT_TRUE(pl.ok()) << pl.error().to_string();
    EXPECT_EQ(*pl, generated) << file;
  }
}

TEST(Placement, IssueExampleParses) {
  auto pl = Placement::parse(R"(devices: 4
memory_limit: 4
blocks:
  - {name: f0, kind: F, devices: [0], span: 1, memory: 1}
  - {name: f1, kind: F, devices: [1], span: 1, memory: 1, after: [f0]}
  - {name: b1, kind: B, devices: [1], span: 2, memory: -1, after: [f1]}
  - {name: b0, kind: B, devices: [0], span: 2, memory: -1, after: [b1]}
)",
                             "example.yaml");
  ASSERT_TRUE(pl.ok()) << pl.error().to_string();
  EXPECT_EQ(pl->blocks()[2].stage, StageId(1));
  EXPECT_EQ(pl->memory_limit(), 4);
  auto r = find_repetend(*pl);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->period, 3);
}

TEST(Placement, ErrorsNameFileLineAndBlock) {
  auto typo = Placement::parse(
      "devices: 2\nblocks:\n  - {name: f0, kind: F, devices: [0], spna: 1}\n", "p.yaml");
  ASSERT_FALSE(typo.ok());
  EXPECT_EQ(typo.error().message, "p.yaml:3: block 0: unknown key 'spna' (did you mean 'span'?)");
  auto dep = Placement::parse(
      "devices: 1\nblocks:\n  - {name: f0, kind: F, devices: [0], memory: 1}\n"
      "  - {name: b0, kind: B, devices: [0], memory: -1, after: [f9]}\n",
      "p.yaml");
  ASSERT_FALSE(dep.ok());
  EXPECT_EQ(dep.error().message,
            "p.yaml:4: block 'b0': 'after' names 'f9', which is not a block (did you mean 'f0'?)");
  auto dev =
      Placement::parse("devices: 1\nblocks:\n  - {name: f0, kind: F, devices: [3]}\n", "p.yaml");
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.error().message, "p.yaml: block 'f0' runs on device 3, outside 0..0");
  auto leak = Placement::parse(
      "devices: 1\nblocks:\n  - {name: f0, kind: F, devices: [0], memory: 1}\n", "p.yaml");
  ASSERT_FALSE(leak.ok());
  EXPECT_NE(leak.error().message.find("memory of device 0 changes by 1"), std::string::npos);
  auto missing = Placement::load("/nonexistent/placement.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message, "cannot read placement file '/nonexistent/placement.yaml'");
}

}  // namespace
}  // namespace loom::sched
