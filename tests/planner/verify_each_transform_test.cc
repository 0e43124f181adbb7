// Per-transform verification in the policies (graph/rewriter.h): a broken transform inside a
// policy fails at that transform, naming the policy, the transform and the op; every built-in
// policy passes with the checks on, on GPT, Swin and the Evoformer.
#include <gtest/gtest.h>

#include <set>

#include "graph/transform.h"
#include "graph/verify.h"
#include "models/model.h"
#include "plan/plan_spec.h"
#include "planner/policy.h"
#include "tests/support/plan_chain.h"

namespace loom::planner {
namespace {

using graph::VerifyMode;

Config config(const std::string& model, const std::vector<std::string>& overrides) {
  auto c =
      parse_config("model: {type: " + model + ", preset: tiny}\nbatch: {global: 8, micro: 2}\n",
                   "v.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

// plan::planned_graph with the verification mode chosen here rather than by the build type.
Result<graph::Graph> plan(const Config& c, const PolicyRegistry& policies, VerifyMode mode) {
  LOOM_ASSIGN_OR_RETURN(const loom::plan::PlanSpec spec, loom::plan::PlanSpec::of(c));
  LOOM_ASSIGN_OR_RETURN(graph::Graph single, testing_support::single_device_graph(c));
  LOOM_TRY(testing_support::check_split(c));
  return plan_graph(single, PlanRequest{spec.space, c.parallel.world_size(), spec.optimizer, mode},
                    policies);
}

TEST(VerifyEachTransform, EveryBuiltinPolicyPassesOnEveryModel) {
  struct Case {
    std::string model;
    std::vector<std::string> overrides;
  };
  const std::vector<Case> cases = {
      {"gpt", {"parallel.dp=2", "parallel.tp=2", "parallel.pp=2"}},
      {"gpt",
       {"parallel.tp=2", "parallel.sp=true", "parallel.pp=2", "parallel.chunks=2",
        "model.args.layers=4"}},
      {"gpt", {"parallel.pp=2", "parallel.tp=2", "parallel.schedule=chimera"}},
      {"gpt", {"parallel.policy=dp", "parallel.dp=4"}},
      {"gpt", {"parallel.policy=tp", "parallel.tp=4"}},
      {"gpt", {"parallel.policy=sp", "parallel.tp=2", "parallel.sp=true"}},
      {"gpt", {"parallel.policy=pp", "parallel.pp=2"}},
      {"swin", {"parallel.dp=2", "parallel.tp=2"}},
      {"swin", {"parallel.policy=window", "parallel.tp=2", "parallel.pp=2"}},
      {"swin", {"parallel.policy=window", "parallel.dp=2", "parallel.tp=4"}},
      {"evoformer", {"parallel.policy=dap", "parallel.tp=2"}},
      {"evoformer", {"parallel.policy=dap", "parallel.dp=2", "parallel.tp=2", "parallel.pp=2"}},
      {"evoformer", {"parallel.dp=2", "parallel.pp=2"}},
  };
  const PolicyRegistry policies = PolicyRegistry::with_builtin_policies();
  const graph::OpRegistry ops = graph::OpRegistry::with_builtin_ops();
  std::set<std::string> covered;
  for (const Case& k : cases) {
    std::string what = k.model;
    for (const auto& o : k.overrides) what += " " + o;
    SCOPED_TRACE(what);
    const Config c = config(k.model, k.overrides);
    auto g = plan(c, policies, VerifyMode::kEachTransform);
    ASSERT_TRUE(g.ok()) << g.error().message;
    Status whole = graph::verify(*g, ops);
    EXPECT_TRUE(whole.ok()) << whole.error().message;
    covered.insert(c.parallel.policy);
  }
  // A new built-in policy joins the cases above.
  const auto names = policies.names();
  EXPECT_EQ(covered, std::set<std::string>(names.begin(), names.end()));
}

// One op-level bug per policy, each applied to the op `victim` through the policy's Rewriter.
enum class Bug { kDropsAPart, kSplitsTheWrongDim, kOffTheMesh };

Policy broken(Bug bug, std::string victim) {
  return [bug, victim](const graph::Graph& g, const PlanRequest& r) -> Result<graph::Graph> {
    const graph::Rewriter rw = r.rewriter(g);
    graph::Graph out = g;
    std::vector<graph::Op>& ops = out.mutable_ops();
    ops.clear();
    for (const graph::Op& op : g.ops()) {
      std::vector<graph::Op> parts{op};
      if (op.name() == victim && bug != Bug::kOffTheMesh) {
        LOOM_ASSIGN_OR_RETURN(
            parts, rw.rewrite("partition", "dim n, 2", op,
                              [bug](const graph::Op& o) -> Result<std::vector<graph::Op>> {
                                LOOM_ASSIGN_OR_RETURN(auto halves, graph::split_op(o, "n", 2));
                                if (bug == Bug::kDropsAPart) halves.pop_back();
                                if (bug == Bug::kSplitsTheWrongDim)  // the weight along k, not n
                                  for (size_t i = 0; i < halves.size(); ++i) {
                                    const auto& whole = o.inputs[1].ranges;
                                    const int64_t k = whole[1].size() / 2;
                                    const int64_t at = static_cast<int64_t>(i) * k;
                                    halves[i].inputs[1].ranges = {whole[0], {at, at + k}};
                                  }
                                return halves;
                              }));
      }
      for (graph::Op& part : parts) {
        const int64_t device = bug == Bug::kOffTheMesh && op.name() == victim ? r.world_size : 0;
        LOOM_TRY(rw.assign(part, DeviceId(device), r.world_size));
        part.id = OpId(static_cast<int64_t>(ops.size()));
        ops.push_back(std::move(part));
      }
    }
    return out;
  };
}

std::string broken_plan_error(Bug bug, VerifyMode mode) {
  PolicyRegistry policies = PolicyRegistry::with_builtin_policies();
  EXPECT_TRUE(policies.add("broken", broken(bug, "h0.mlp.fc1")).ok());
  auto g = plan(config("gpt", {"parallel.policy=broken", "parallel.dp=2"}), policies, mode);
  if (!g.ok()) return g.error().message;
  // Unchecked, the broken graph leaves the policy; only the whole-graph verifier sees it.
  Status whole = graph::verify(*g, graph::OpRegistry::with_builtin_ops());
  return whole.ok() ? "" : "after the policy: " + whole.error().message;
}

TEST(VerifyEachTransform, ADroppedPartFailsAtItsTransform) {
  const std::string e = broken_plan_error(Bug::kDropsAPart, VerifyMode::kEachTransform);
  EXPECT_EQ(e.rfind("broken policy: partition(op 'h0.mlp.fc1', dim n, 2) left 'h0.mlp.fc1' "
                    "unproducible: the parts write [0:4, 0:32, 0:128] of the piece "
                    "[0:4, 0:32, 0:256] the op wrote",
                    0),
            0u)
      << e;
  // With the checks off the same bug surfaces later, at the consumer, far from its cause.
  const std::string late = broken_plan_error(Bug::kDropsAPart, VerifyMode::kOff);
  EXPECT_NE(late.find("after the policy: op 'h0.mlp.fc1.bias' (bias_add): no ops write enough "
                      "of 'h0.mlp.fc1'"),
            std::string::npos)
      << late;
}

TEST(VerifyEachTransform, AWrongDimensionFailsAtItsTransform) {
  const std::string e = broken_plan_error(Bug::kSplitsTheWrongDim, VerifyMode::kEachTransform);
  EXPECT_EQ(e.rfind("broken policy: partition(op 'h0.mlp.fc1', dim n, 2): op 'h0.mlp.fc1[0/2]' "
                    "(linear): ",
                    0),
            0u)
      << e;
}

TEST(VerifyEachTransform, AnOpOffTheMeshFailsAtItsAssignment) {
  EXPECT_EQ(broken_plan_error(Bug::kOffTheMesh, VerifyMode::kEachTransform),
            "broken policy: assign(op 'h0.mlp.fc1', device 2): the plan has 2 devices");
}

}  // namespace
}  // namespace loom::planner
