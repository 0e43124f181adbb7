// The per-op oracle on GPT tiny: every sub-operator of every plan computes exactly the piece of
// the single-device run it claims.
#include "runtime/oracle.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include "data/sources.h"
#include "graph/verify.h"
#include "models/model.h"
#include "planner/policy.h"
#include "runtime/executor.h"
#include "tests/support/plan_chain.h"

namespace loom {
namespace {

struct Fixture {
  Config config;
  graph::OpRegistry ops = graph::OpRegistry::with_builtin_ops();
  runtime::KernelRegistry kernels = runtime::KernelRegistry::with_builtin_kernels();
  graph::Graph single;
  std::vector<at::Tensor> values;
};

Fixture make(const std::vector<std::string>& overrides) {
  Fixture f;
  auto c = parse_config("model: {type: gpt, preset: tiny}\nbatch: {global: 4, micro: 2}\n",
                        "t.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  f.config = *c;
  auto g = testing_support::single_device_graph(f.config, f.ops);
  EXPECT_TRUE(g.ok()) << g.error().message;
  f.single = *g;
  const int64_t rows = f.single.tensor(*f.single.find_tensor("tokens")).shape[0];
  const int64_t seq = f.single.tensor(*f.single.find_tensor("tokens")).shape[1];
  auto data = data::make_token_source(f.config, 256, seq);
  at::Tensor tokens = at::empty({rows, seq}, at::kLong),
             targets = at::empty({rows, seq}, at::kLong);
  std::vector<int64_t> buf(seq + 1);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE((*data)->sample(r, buf.data()).ok());
    for (int64_t t = 0; t < seq; ++t) {
      tokens[r][t] = buf[t];
      targets[r][t] = buf[t + 1];
    }
  }
  at::NoGradGuard no_grad;
  f.values = runtime::reference_values(f.single, f.kernels, 11,
                                       {{f.single.find_tensor("tokens")->value(), tokens},
                                        {f.single.find_tensor("targets")->value(), targets}});
  return f;
}

graph::Graph planned(const Fixture& f) {
  auto policies = planner::PolicyRegistry::with_builtin_policies();
  auto space = testing_support::space_of(f.config);
  EXPECT_TRUE(space.ok()) << space.error().message;
  if (!space.ok()) return f.single;
  auto g = planner::plan_graph(f.single, {*space, f.config.parallel.world_size()}, policies);
  EXPECT_TRUE(g.ok()) << g.error().message;
  return g.ok() ? *g : f.single;
}

void expect_plan_correct(const std::vector<std::string>& overrides, int64_t world) {
  Fixture f = make(overrides);
  graph::Graph g = planned(f);
  Status v = graph::verify(g, f.ops);
  EXPECT_TRUE(v.ok()) << v.error().message;
  std::vector<int64_t> ops_on(world, 0);
  for (const auto& op : g.ops()) {
    ASSERT_TRUE(op.device.value() >= 0 && op.device.value() < world) << op.name();
    ++ops_on[op.device.value()];
  }
  for (int64_t r = 0; r < world; ++r) EXPECT_GT(ops_on[r], 0) << "rank " << r << " has no ops";
  runtime::OracleReport report = runtime::check_plan_ops(g, f.values, f.kernels);
  EXPECT_TRUE(report.ok()) << report.mismatches.size() << " mismatches, first: "
                           << (report.mismatches.empty() ? "" : report.mismatches[0]);
  EXPECT_EQ(report.ops_checked, static_cast<int64_t>(g.ops().size()));
}

TEST(Oracle, Dp2) { expect_plan_correct({"parallel.dp=2"}, 2); }
TEST(Oracle, Tp2) { expect_plan_correct({"parallel.tp=2"}, 2); }
TEST(Oracle, Tp4) { expect_plan_correct({"parallel.tp=4"}, 4); }
TEST(Oracle, Tp2Sp) { expect_plan_correct({"parallel.tp=2", "parallel.sp=true"}, 2); }
TEST(Oracle, Pp2) { expect_plan_correct({"parallel.pp=2"}, 2); }
TEST(Oracle, Pp4Uneven) { expect_plan_correct({"parallel.pp=4", "model.args.layers=6"}, 4); }
TEST(Oracle, Dp2Tp2) { expect_plan_correct({"parallel.dp=2", "parallel.tp=2"}, 4); }
TEST(Oracle, Tp2Pp2) { expect_plan_correct({"parallel.tp=2", "parallel.pp=2"}, 4); }
TEST(Oracle, Dp2Tp2Pp2) {
  expect_plan_correct({"parallel.dp=2", "parallel.tp=2", "parallel.pp=2", "parallel.sp=true"}, 8);
}
TEST(Oracle, Pp2Chunks2) {
  expect_plan_correct({"parallel.pp=2", "parallel.chunks=2", "model.args.layers=4"}, 2);
}

TEST(Oracle, CatchesASubOpThatClaimsTheWrongPiece) {
  Fixture f = make({"parallel.tp=2"});
  graph::Graph g = planned(f);
  // Make the second half of the first column-parallel linear claim the first half's outputs.
  for (auto& op : g.mutable_ops())
    if (op.type() == "linear" && op.attrs().get_or<std::string>("tp", "") == "column" &&
        op.parts.back().index == 1) {
      op.outputs[0].ranges[2] = {0, op.outputs[0].ranges[2].size()};
      break;
    }
  runtime::OracleReport report = runtime::check_plan_ops(g, f.values, f.kernels);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.mismatches[0].find("h0.attn.q[1/2]"), std::string::npos) << report.mismatches[0];
}

TEST(Oracle, CatchesMissingValueChunks) {
  Fixture f = make({"parallel.tp=2"});
  graph::Graph g = planned(f);
  auto& ops = g.mutable_ops();
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].type() == "embedding" && ops[i].parts.back().index == 1) {
      ops.erase(ops.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  runtime::OracleReport report = runtime::check_plan_ops(g, f.values, f.kernels);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.mismatches[0].find("1 of 2 value chunks"), std::string::npos)
      << report.mismatches[0];
}

}  // namespace
}  // namespace loom
