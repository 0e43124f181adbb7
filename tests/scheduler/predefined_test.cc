// Predefined schedules against their papers' closed forms (uniform stages, zero communication).
#include "scheduler/predefined.h"

#include <gtest/gtest.h>

#include <tuple>

#include "scheduler/simulator.h"

namespace loom::sched {
namespace {

constexpr double kTol = 1e-9;

Timeline run(const Result<Schedule>& s) {
  EXPECT_TRUE(s.ok()) << s.error().to_string();
  auto t = simulate(*s);
  EXPECT_TRUE(t.ok()) << t.error().to_string();
  return *t;
}

struct Grid {
  int p, m;
};
std::vector<Grid> grid() {
  std::vector<Grid> g;
  for (int p : {2, 4, 8})
    for (int f : {1, 2, 3}) g.push_back({p, f * p});
  return g;
}

TEST(Predefined, GPipeClosedForm) {
  for (auto [p, m] : grid()) {
    PipelineSpec spec = PipelineSpec::of(p, m);
    Timeline t = run(gpipe(spec));
    EXPECT_NEAR(t.makespan, (m + p - 1) * (spec.fwd + spec.bwd), kTol) << p << " " << m;
    EXPECT_NEAR(t.bubble_ratio, double(p - 1) / (m + p - 1), kTol);
    for (int d = 0; d < p; ++d) EXPECT_NEAR(t.peak_memory[d], m, kTol);
  }
}

// Devices at their own speed (SimOptions::device_factor): GPipe's forwards, then its backwards,
// are a flow shop of m identical jobs, whose makespan is the sum of one job's stage times plus
// (m - 1) times the slowest stage's.
TEST(Predefined, GPipeDevicesAtTheirOwnSpeed) {
  const int p = 4, m = 8;
  const PipelineSpec spec = PipelineSpec::of(p, m);
  auto s = gpipe(spec);
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  const std::vector<double> factor = {1, 1, 1, 2};  // the last stage holds the head
  auto t = simulate(*s, SimOptions{0, factor});
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  const double block = spec.fwd + spec.bwd;
  EXPECT_NEAR(t->makespan, (1 + 1 + 1 + 2 + (m - 1) * 2) * block, kTol);
  for (int d = 0; d < p; ++d) EXPECT_NEAR(t->busy[d], m * block * factor[d], kTol) << d;
  // The uniform pipeline for comparison: (p + m - 1) blocks.
  EXPECT_NEAR(run(s).makespan, (p + m - 1) * block, kTol);
}

TEST(Predefined, OneFOneBClosedForm) {
  for (auto [p, m] : grid()) {
    PipelineSpec spec = PipelineSpec::of(p, m);
    Timeline t = run(one_f_one_b(spec));
    EXPECT_NEAR(t.makespan, (m + p - 1) * (spec.fwd + spec.bwd), kTol) << p << " " << m;
    EXPECT_NEAR(t.bubble_ratio, double(p - 1) / (m + p - 1), kTol);
    for (int d = 0; d < p; ++d) EXPECT_NEAR(t.peak_memory[d], std::min(p - d, m), kTol);
  }
}

TEST(Predefined, InterleavedClosedForm) {
  for (auto [p, m] : grid())
    for (int v : {2, 4}) {
      PipelineSpec spec = PipelineSpec::of(p, m, v);
      Timeline t = run(interleaved_1f1b(spec));
      EXPECT_NEAR(t.makespan, (v * m + p - 1) * (spec.fwd + spec.bwd) / v, kTol)
          << p << " " << m << " " << v;
      EXPECT_NEAR(t.bubble_ratio, double(p - 1) / (v * m + p - 1), kTol);
      for (int d = 0; d < p; ++d) {
        double chunks = m == p ? v * m : std::min(2 * (p - d - 1) + (v - 1) * p + 1, v * m);
        EXPECT_NEAR(t.peak_memory[d], chunks / v, kTol) << p << " " << m << " " << v << " d" << d;
      }
    }
}

TEST(Predefined, LoopedBfsClosedForm) {
  for (auto [p, m] : grid())
    for (int v : {2, 4}) {
      PipelineSpec spec = PipelineSpec::of(p, m, v);
      Timeline t = run(looped_bfs(spec));
      EXPECT_NEAR(t.makespan, (v * m + p - 1) * (spec.fwd + spec.bwd) / v, kTol);
      EXPECT_NEAR(t.bubble_ratio, double(p - 1) / (v * m + p - 1), kTol);
      for (int d = 0; d < p; ++d) EXPECT_NEAR(t.peak_memory[d], m, kTol);
    }
}

TEST(Predefined, ChimeraClosedForm) {
  for (auto [p, m] : grid()) {
    PipelineSpec spec = PipelineSpec::of(p, m);
    spec.bwd = spec.fwd;
    Timeline t = run(chimera(spec));
    EXPECT_NEAR(t.bubble_ratio, double(p - 2) / (2 * m + p - 2), kTol) << p << " " << m;
    EXPECT_NEAR(t.makespan, (2 * m + p - 2) * spec.fwd, kTol) << p << " " << m;
    // Chimera's memory: p/2 + 1 + min(d, p-1-d) for one basic unit (m = p), p beyond.
    for (int d = 0; d < p; ++d) {
      double expected = m == p ? p / 2 + 1 + std::min(d, p - 1 - d) : p;
      EXPECT_NEAR(t.peak_memory[d], expected, kTol) << p << " " << m << " d" << d;
    }
  }
}

TEST(Predefined, ZbH1ClosedForm) {
  for (auto [p, m] : grid()) {
    PipelineSpec spec = PipelineSpec::of(p, m);
    spec.fwd = 1, spec.bwd = 1, spec.wgrad = 1;
    Timeline t = run(zb_h1(spec));
    double tf = spec.fwd, ti = spec.bwd, tw = spec.wgrad;
    EXPECT_NEAR(t.makespan, m * (tf + ti + tw) + (p - 1) * (tf + ti - tw), kTol) << p << " " << m;
    EXPECT_NEAR(t.bubble_ratio, 1 - m * (tf + ti + tw) / t.makespan, kTol);
    EXPECT_NEAR(t.bubble_ratio,
                (p - 1) * (tf + ti - tw) / (m * (tf + ti + tw) + (p - 1) * (tf + ti - tw)), kTol);
    // 1F1B's memory: a peak of min(p, m) micro-batches (stage 0 holds it; later stages hold
    // deferred W's activations but never more).
    EXPECT_NEAR(t.max_peak_memory(), std::min(p, m), kTol);
    EXPECT_NEAR(t.peak_memory[0], std::min(p, m), kTol);
  }
}

}  // namespace
}  // namespace loom::sched

namespace loom::sched {
namespace {

TEST(Predefined, ZbH1UnequalTimes) {
  for (auto [tf, ti, tw] : {std::tuple{2.0, 2.0, 1.0}, std::tuple{1.0, 1.0, 0.5}}) {
    for (auto [p, m] : grid()) {
      PipelineSpec spec = PipelineSpec::of(p, m);
      spec.fwd = tf, spec.bwd = ti, spec.wgrad = tw;
      Timeline t = run(zb_h1(spec));
      EXPECT_NEAR(t.makespan, m * (tf + ti + tw) + (p - 1) * (tf + ti - tw), kTol)
          << p << " " << m << " " << tf << " " << ti << " " << tw;
    }
  }
}

TEST(Predefined, ErrorsSayWhatMustHold) {
  auto c = chimera(PipelineSpec::of(3, 4));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message, "chimera needs an even number of stages, got 3");
  auto i = interleaved_1f1b(PipelineSpec::of(4, 5, 2));
  ASSERT_FALSE(i.ok());
  EXPECT_EQ(i.error().message, "interleaved needs m to be a multiple of p, got m=5 p=4");
  auto k = parse_schedule_kind("1fb1");
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.error().message.find("did you mean '1f1b'"), std::string::npos) << k.error().message;
}

TEST(Predefined, AnyMicroBatchCountWhereDefined) {
  for (int m = 1; m <= 7; ++m)
    for (auto kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kLoopedBfs,
                      ScheduleKind::kZbH1}) {
      auto s =
          build_predefined(kind, PipelineSpec::of(4, m, kind == ScheduleKind::kLoopedBfs ? 2 : 1));
      ASSERT_TRUE(s.ok()) << to_string(kind) << " m=" << m << ": " << s.error().to_string();
      EXPECT_TRUE(simulate(*s).ok());
    }
}

TEST(Predefined, ExecutorOrders) {
  auto orders = device_orders(ScheduleKind::k1F1B, 2, 3);
  ASSERT_TRUE(orders.ok());
  ASSERT_EQ(orders->size(), 2u);
  std::vector<std::string> d0;
  for (const auto& b : (*orders)[0]) d0.push_back(b.to_string());
  EXPECT_EQ(d0, (std::vector<std::string>{"0F0", "0F1", "0B0", "0F2", "0B1", "0B2"}));
}

}  // namespace
}  // namespace loom::sched
