// launch/calibration.h: the alpha-beta fit recovers what made its points, the coefficients are
// lower's own cost formulas, a plan's linears are found, and the written file reads back as
// the cost model it describes.
#include "launch/calibration.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "core/config.h"
#include "lower/path.h"
#include "plan/plan.h"

namespace loom::calibrate {
namespace {

using runtime::CommSample;
using runtime::LinearShape;

TEST(FitAlphaBeta, RecoversAlphaAndBetaOfExactPoints) {
  const double alpha = 3e-5, beta = 4e-10;
  std::vector<FitPoint> points;
  for (double bytes = 1024; bytes <= 64 << 20; bytes *= 4)
    for (double a : {1.0, 2.0}) points.push_back({a, bytes, a * alpha + bytes * beta});
  auto fit = fit_alpha_beta(points);
  ASSERT_TRUE(fit.ok()) << fit.error().message;
  EXPECT_NEAR(fit->alpha_s, alpha, alpha * 1e-9);
  EXPECT_NEAR(fit->beta_s_per_byte, beta, beta * 1e-9);
  EXPECT_LT(fit->rms_relative_residual, 1e-9);
  EXPECT_EQ(fit->points, static_cast<int64_t>(points.size()));
}

TEST(FitAlphaBeta, ReportsTheResidualOfNoisyPoints) {
  // Every other time 10 % high: the fit stays close and says how far off the points are.
  std::vector<FitPoint> points;
  int i = 0;
  for (double bytes = 1024; bytes <= 16 << 20; bytes *= 2, ++i)
    points.push_back({1, bytes, (1e-5 + bytes * 1e-9) * (i % 2 ? 1.1 : 1.0)});
  auto fit = fit_alpha_beta(points);
  ASSERT_TRUE(fit.ok());
  EXPECT_NEAR(fit->alpha_s, 1.05e-5, 0.1e-5);
  EXPECT_NEAR(fit->beta_s_per_byte, 1.05e-9, 0.1e-9);
  EXPECT_GT(fit->rms_relative_residual, 0.02);
  EXPECT_LT(fit->rms_relative_residual, 0.1);
}

TEST(FitAlphaBeta, RejectsOneSizeAndNonPositiveTimes) {
  EXPECT_FALSE(fit_alpha_beta({{1, 1024, 1e-5}}).ok());
  EXPECT_FALSE(fit_alpha_beta({{1, 1024, 1e-5}, {2, 2048, 2e-5}}).ok());  // multiples
  EXPECT_FALSE(fit_alpha_beta({{1, 1024, 1e-5}, {1, 4096, 0}}).ok());
}

TEST(FitPoint, UsesTheLoweringsCostFormulas) {
  // A fitted alpha and beta put back into primitive_rules() give the measured time.
  const double alpha = 2e-5, beta = 5e-10;
  for (const lower::PrimitiveRule& rule : lower::primitive_rules()) {
    const std::string name = lower::to_string(rule.primitive);
    if (name != "all_reduce" && name != "all_gather" && name != "reduce_scatter" &&
        name != "all_to_all")
      continue;
    for (int64_t k : {2, 4, 8}) {
      std::vector<FitPoint> points;
      for (int64_t bytes : default_message_bytes(false))
        points.push_back(fit_point(
            CommSample{name, k, bytes, rule.cost(k, static_cast<double>(bytes), alpha, beta)}));
      auto fit = fit_alpha_beta(points);
      ASSERT_TRUE(fit.ok()) << name;
      EXPECT_NEAR(fit->alpha_s, alpha, alpha * 1e-6) << name << " k=" << k;
      EXPECT_NEAR(fit->beta_s_per_byte, beta, beta * 1e-6) << name << " k=" << k;
    }
  }
  const FitPoint p = fit_point(CommSample{"send_recv", 2, 4096, 1e-4});
  EXPECT_EQ(p.alpha_coef, 1);
  EXPECT_EQ(p.beta_coef, 4096);
  // all_reduce on 2 ranks: 2 latencies and 2 (n - 1) / n = 1 times the bytes.
  const FitPoint ar = fit_point(CommSample{"all_reduce", 2, 4096, 1e-4});
  EXPECT_EQ(ar.alpha_coef, 2);
  EXPECT_EQ(ar.beta_coef, 4096);
}

TEST(LinearShapes, AreTheGptPlansLinears) {
  auto config = load_config(std::string(LOOM_SOURCE_DIR) + "/configs/gpt-tiny.yaml");
  ASSERT_TRUE(config.ok()) << config.error().message;
  auto plan = plan::make_plan(*config);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  const std::vector<LinearShape> shapes = linear_shapes(plan->file.graph);
  ASSERT_FALSE(shapes.empty());
  // GPT tiny: hidden 64, vocabulary 256, 32 tokens per sample; every linear sees every token of
  // a micro-batch.
  int64_t count = 0;
  bool mlp_down = false, up_or_head = false;
  for (const LinearShape& s : shapes) {
    EXPECT_EQ(s.m, config->batch.micro * 32) << s.m << "x" << s.k << "x" << s.n;
    count += s.count;
    mlp_down |= s.k == 256 && s.n == 64 && s.count == 2;  // [tokens, 4 * 64] x [4 * 64, 64]
    up_or_head |= s.k == 64 && s.n == 256;  // the MLP's up projection and the vocabulary head
  }
  EXPECT_TRUE(mlp_down);
  EXPECT_TRUE(up_or_head);
  EXPECT_GE(count, 2 * 4 + 1);  // per layer attention and MLP projections, and the head
}

// Every primitive at 40 us and 2 GB/s, but all-gather at 80 us and 1 GB/s.
double alpha_of(const std::string& p) { return p == "all_gather" ? 8e-5 : 4e-5; }
double beta_of(const std::string& p) { return p == "all_gather" ? 1e-9 : 5e-10; }

// A rank of `world_size` whose products take 1, 1 and 2 ms with every rank busy, and whose
// collectives take exactly alpha_of + beta_of's time.
runtime::RankMeasurements measured_rank(int64_t rank, int64_t world_size) {
  runtime::RankMeasurements m;
  m.rank = rank;
  m.world_size = world_size;
  m.linear_seconds = {{1e-3, 1e-3, 2e-3}};
  m.copy_seconds_per_byte = 1e-10;
  m.memory_bytes = 12.0 * (1 << 30);
  for (const std::string& primitive : runtime::calibrated_primitives())
    for (int64_t bytes : default_message_bytes(true)) {
      CommSample s{primitive, world_size, bytes, 0};
      const FitPoint p = fit_point(s);
      s.seconds = p.alpha_coef * alpha_of(primitive) + p.beta_coef * beta_of(primitive);
      m.comm.push_back(s);
    }
  return m;
}

TEST(Calibration, WritesAFileThatParsesBackAsTheModel) {
  runtime::CalibrationRequest request;
  request.linears = {{64, 32, 128, 2}};
  const runtime::RankMeasurements rank = measured_rank(1, 2);
  runtime::RankMeasurements first = measured_rank(0, 2);
  first.alone_linear_seconds = {{0.5e-3, 0.5e-3, 1e-3}};  // twice as fast alone
  auto c = combine(request, {first, rank}, "cpu", {"a test"});
  ASSERT_TRUE(c.ok()) << c.error().message;
  // 3 products of 2 * 64 * 32 * 128 FLOPs, each linear twice, over 2 * 2 ms alone and 2 * 4 ms
  // with both ranks at once: the node sustains the two ranks' rates together, as one alone.
  const double alone = 2 * 3 * 2.0 * 64 * 32 * 128 / 4e-3;
  EXPECT_NEAR(c->model.device_flops_per_s, alone, 1);
  EXPECT_NEAR(c->model.node_flops_per_s, alone, 1);
  EXPECT_NEAR(c->model.node_compute_flops_per_s(), alone, 1);
  for (const std::string& primitive : runtime::calibrated_primitives()) {
    const CostModel::Link own = c->model.intra_link(primitive);
    EXPECT_NEAR(own.alpha_s, alpha_of(primitive), 1e-12) << primitive;
    EXPECT_NEAR(own.beta_s_per_byte, beta_of(primitive), 1e-18) << primitive;
  }
  // The link's own values are the fit over every primitive: between the two.
  EXPECT_GT(c->model.intra_alpha_s, 4e-5);
  EXPECT_LT(c->model.intra_alpha_s, 8e-5);
  auto parsed = CostModel::parse(to_yaml(*c), "calibrated.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  CostModel cpu;
  for (const auto& [name, m] : builtin_cost_models().presets)
    if (name == "cpu") cpu = m;
  // The file keeps 4 significant digits.
  EXPECT_NEAR(parsed->device_flops_per_s, c->model.device_flops_per_s,
              c->model.device_flops_per_s * 1e-3);
  EXPECT_NEAR(parsed->node_flops_per_s, c->model.node_flops_per_s,
              c->model.node_flops_per_s * 1e-3);
  EXPECT_NEAR(parsed->intra_alpha_s, c->model.intra_alpha_s, c->model.intra_alpha_s * 1e-3);
  for (const std::string& primitive : runtime::calibrated_primitives()) {
    const CostModel::Link own = parsed->intra_link(primitive);
    EXPECT_NEAR(own.alpha_s, alpha_of(primitive), alpha_of(primitive) * 1e-3) << primitive;
    EXPECT_NEAR(own.beta_s_per_byte, beta_of(primitive), beta_of(primitive) * 1e-3) << primitive;
  }
  EXPECT_EQ(parsed->device_memory_bytes, 12.0 * (1 << 30));
  EXPECT_EQ(parsed->local_beta_s_per_byte, 1e-10);
  EXPECT_EQ(parsed->inter_alpha_s, cpu.inter_alpha_s);
  EXPECT_EQ(parsed->inter_beta_s_per_byte, cpu.inter_beta_s_per_byte);
  EXPECT_EQ(parsed->devices_per_node, 2);
  EXPECT_NE(to_table(*c).find("all_to_all"), std::string::npos);
}

// Four ranks: rank 0 alone, two at once (the partial level) and all four at once are measured;
// the node's rate is the best sum over them (here two ranks fill the cores and four only
// time-slice them).
TEST(Calibration, NodeRateIsTheBestSumOverBusyLevels) {
  EXPECT_TRUE(runtime::partial_busy_levels(2).empty());
  EXPECT_EQ(runtime::partial_busy_levels(4), (std::vector<int64_t>{2}));
  EXPECT_EQ(runtime::partial_busy_levels(8), (std::vector<int64_t>{2, 4}));
  runtime::CalibrationRequest request;
  request.linears = {{64, 32, 128, 2}};
  std::vector<runtime::RankMeasurements> ranks;
  for (int64_t r = 0; r < 4; ++r) {
    runtime::RankMeasurements m = measured_rank(r, 4);
    m.linear_seconds = {{2e-3, 2e-3, 4e-3}};  // all four at once: 8 ms a round
    // Ranks 0 and 1 at once: 3.2 ms a round; ranks 2 and 3 waited.
    m.level_linear_seconds = {r < 2 ? std::vector<std::array<double, 3>>{{0.8e-3, 0.8e-3, 1.6e-3}}
                                    : std::vector<std::array<double, 3>>{}};
    if (r == 0) m.alone_linear_seconds = {{0.5e-3, 0.5e-3, 1e-3}};  // 2 ms a round
    ranks.push_back(m);
  }
  auto c = combine(request, ranks, "cpu", {"a test"});
  ASSERT_TRUE(c.ok()) << c.error().message;
  const double round_flops = 3 * 2.0 * 64 * 32 * 128;  // a linear's three products
  EXPECT_NEAR(c->model.device_flops_per_s, round_flops / 2e-3, 1);
  // Two at once: 2 / 3.2 ms beats four at once (4 / 8 ms) and rank 0 alone (1 / 2 ms).
  EXPECT_NEAR(c->model.node_flops_per_s, 2 * round_flops / 3.2e-3, 1);
}

TEST(Calibration, RoundTripsTheRanksFiles) {
  runtime::CalibrationRequest request;
  request.linears = {{8, 16, 32, 3}};
  request.message_bytes = {1024, 4096};
  auto back = request_from_json(request_to_json(request));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->linears, request.linears);
  EXPECT_EQ(back->message_bytes, request.message_bytes);
  runtime::RankMeasurements m;
  m.rank = 1;
  m.linear_seconds = {{1, 2, 3}};
  m.alone_linear_seconds = {{0.5, 1, 1.5}};
  m.level_linear_seconds = {{{1, 1, 1}}, {}};
  m.comm = {{"all_reduce", 2, 1024, 1e-5}};
  auto m2 = measurements_from_json(measurements_to_json(m));
  ASSERT_TRUE(m2.ok());
  EXPECT_EQ(m2->rank, 1);
  EXPECT_EQ(m2->linear_seconds, m.linear_seconds);
  EXPECT_EQ(m2->alone_linear_seconds, m.alone_linear_seconds);
  EXPECT_EQ(m2->level_linear_seconds, m.level_linear_seconds);
  EXPECT_EQ(m2->comm.at(0).seconds, 1e-5);
  EXPECT_FALSE(request_from_json("{").ok());
}

}  // namespace
}  // namespace loom::calibrate
