// The Evoformer graph and its plans without LibTorch: the tiny preset builds and verifies, DAP
// splits every op along its hinted axis, and the lowering finds the all-to-alls between the
// row-wise and the column-wise layouts by itself.
#include <gtest/gtest.h>

#include "graph/verify.h"
#include "lower/program.h"
#include "models/evoformer.h"
#include "models/model.h"
#include "plan/plan.h"
#include "tests/support/plan_chain.h"

namespace loom {
namespace {

Config config(const std::vector<std::string>& overrides) {
  auto c = parse_config("model: {type: evoformer, preset: tiny}\nbatch: {global: 4, micro: 2}\n",
                        "evo.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

Result<graph::Graph> plan(const std::vector<std::string>& overrides, int64_t world) {
  return loom::plan::planned_graph(config(overrides), loom::plan::Registries{}, world);
}

int count(const lower::Lowered& l, lower::Primitive p, bool backward = false) {
  int n = 0;
  for (const lower::Adapter& a : l.adapters)
    for (const lower::CommStep& s : (backward ? a.backward : a.forward).steps)
      n += s.primitive == p;
  return n;
}

TEST(EvoformerGraph, TinyBuildsVerifiesAndHintsEveryOp) {
  graph::OpRegistry ops = graph::OpRegistry::with_builtin_ops();
  auto g = testing_support::single_device_graph(config({}), ops);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE(graph::verify(*g, ops).ok());
  std::map<std::string, int> types;
  for (const auto& op : g->ops()) {
    ++types[op.type()];
    ASSERT_TRUE(op.attrs().has("dap")) << op.name();
  }
  // Two blocks: one of each axial attention plus two triangle attentions per block.
  EXPECT_EQ(types["row_attention"], 4);
  EXPECT_EQ(types["column_attention"], 4);
  EXPECT_EQ(types["outer_product_mean"], 2);
  EXPECT_EQ(types["triangle_outgoing"], 2);
  EXPECT_EQ(types["triangle_incoming"], 2);
  EXPECT_EQ(types["cross_entropy"], 1);
  EXPECT_EQ(g->tensor(*g->find_tensor("msa_feat")).shape, (Shape{2, 4, 8, 7}));  // micro 2
}

TEST(EvoformerPlan, DapSplitsRowsAndColumnsAndLowersToAllToAll) {
  for (int64_t n : {2, 4}) {
    auto g = plan({"parallel.policy=dap", "parallel.tp=" + std::to_string(n)}, n);
    ASSERT_TRUE(g.ok()) << g.error().message;
    ASSERT_TRUE(graph::verify(*g, graph::OpRegistry::with_builtin_ops()).ok());
    // Row attention holds whole rows (split along s), column attention whole columns.
    for (const auto& op : g->ops()) {
      if (op.type() == "row_attention" && op.name().find("msa_row") != std::string::npos) {
        EXPECT_EQ(op.outputs[0].ranges[1].size(), 4 / n) << op.name();
        EXPECT_EQ(op.outputs[0].ranges[2].size(), 8) << op.name();
      }
      if (op.type() == "column_attention" && op.name().find("msa_col") != std::string::npos) {
        EXPECT_EQ(op.outputs[0].ranges[1].size(), 4) << op.name();
        EXPECT_EQ(op.outputs[0].ranges[2].size(), 8 / n) << op.name();
      }
      if (op.type() == "triangle_outgoing") {
        EXPECT_EQ(op.outputs[0].ranges[1].size(), 8 / n) << op.name();
      }
      if (op.type() == "triangle_incoming") {
        EXPECT_EQ(op.outputs[0].ranges[2].size(), 8 / n) << op.name();
      }
    }
    lower::PathFinder paths;
    auto l = lower::lower(*g, n, 1, paths);
    ASSERT_TRUE(l.ok()) << l.error().message;
    // Per block: MSA rows -> columns, MSA columns -> rows for the next block, pair columns ->
    // rows (outer product mean), rows -> columns (incoming), columns -> rows (starting node),
    // rows -> columns (ending node); the search finds each as an all-to-all.
    EXPECT_GE(count(*l, lower::Primitive::kAllToAll), 2 * 4) << n;
    EXPECT_GE(count(*l, lower::Primitive::kAllToAll, true), 2 * 4) << n;
    // Biases and the far side of triangle products and outer products are gathered whole.
    EXPECT_GT(count(*l, lower::Primitive::kAllGather), 0) << n;
    const std::string listing = lower::listing(*g, *l, Rank(0));
    EXPECT_NE(listing.find("all_to_all"), std::string::npos) << listing.substr(0, 2000);
  }
}

TEST(EvoformerPlan, DataAndPipelineParallelPlansLower) {
  for (auto [overrides, world] : std::vector<std::pair<std::vector<std::string>, int64_t>>{
           {{"parallel.dp=2"}, 2},
           {{"parallel.pp=2"}, 2},
           {{"parallel.policy=dap", "parallel.dp=2", "parallel.tp=2"}, 4}}) {
    auto g = plan(overrides, world);
    ASSERT_TRUE(g.ok()) << g.error().message;
    lower::PathFinder paths;
    auto l = lower::lower(*g, world, 2, paths);
    EXPECT_TRUE(l.ok()) << l.error().message;
  }
}

TEST(EvoformerPlan, BadDegreesNameTheKey) {
  auto g = plan({"parallel.policy=dap", "parallel.tp=3"}, 3);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("parallel.tp"), std::string::npos) << g.error().message;
  EXPECT_NE(g.error().message.find("seqs (4)"), std::string::npos) << g.error().message;
  g = plan({"parallel.pp=3"}, 3);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("2 blocks"), std::string::npos) << g.error().message;
  auto c = parse_config("model: {type: evoformer, preset: alphafold3}\n", "evo.yaml", {});
  ASSERT_TRUE(c.ok());
  auto spec = models::evoformer_spec(*c);
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.error().message.find("did you mean 'alphafold2'"), std::string::npos)
      << spec.error().message;
}

TEST(EvoformerPlan, DapOnAModelWithoutAxesNamesTheOp) {
  auto c = parse_config("model: {type: gpt, preset: tiny}\nparallel: {policy: dap, tp: 2}\n",
                        "gpt.yaml", {});
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto g = loom::plan::planned_graph(*c, loom::plan::Registries{}, 2);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("parallel.policy"), std::string::npos) << g.error().message;
  EXPECT_NE(g.error().message.find("op 'embed.tok'"), std::string::npos) << g.error().message;
}

}  // namespace
}  // namespace loom
