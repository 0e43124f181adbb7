// CSV round trips, rendering, and placement files.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "scheduler/csv.h"
#include "scheduler/placement.h"
#include "scheduler/predefined.h"
#include "scheduler/render.h"
#include "scheduler/repetend.h"

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

TEST(Csv, ImportErrorsNameTheCell) {
  auto bad = from_csv("0F0,0X1\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("row 1, column 2"), std::string::npos) << bad.error().message;
  auto missing = from_csv("0F0,0F1,0B0\n,1F0,1B0,1F1,1B1\n");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message,
            "block 0B1 (stage 0, micro-batch 1, B) is missing: no rank runs it");
  auto deadlock = from_csv("0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n");
  ASSERT_FALSE(deadlock.ok());
  EXPECT_NE(deadlock.error().message.find("deadlocks"), std::string::npos)
      << deadlock.error().message;
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
