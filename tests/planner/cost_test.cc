// The planner reads an op's FLOPs and tensor-parallel split from its type's registry entry
// (graph::OpRules), so a user's op type brings its own.
#include "planner/cost.h"

#include <gtest/gtest.h>

#include "graph/builder.h"
#include "planner/policy.h"

namespace loom::planner {
namespace {

const graph::Op& op_named(const graph::Graph& g, const std::string& name) {
  for (const graph::Op& op : g.ops())
    if (op.def->name == name) return op;
  ADD_FAILURE() << "no op " << name;
  return g.ops().front();
}

// Ends `b`'s graph with a loss over `logits` [2, 4, v].
Result<graph::Graph> finish(graph::GraphBuilder& b, TensorId logits) {
  const TensorId targets = b.input("targets", {2, 4}, DType::kInt64);
  b.set_loss(
      b.op1("cross_entropy", "loss", {logits, targets}, graph::Attrs{{"normalizer", int64_t{8}}}));
  return b.finish();
}

TEST(OpFlops, BuiltinRulesAndTheFallback) {
  const graph::OpRegistry r = graph::OpRegistry::with_builtin_ops();
  graph::GraphBuilder b(r, "g");
  const TensorId x = b.input("x", {2, 4, 8}, DType::kFloat32);
  const TensorId w = b.parameter("w", {16, 8}, graph::ParamInit::normal(0.02));
  const TensorId y = b.op1("linear", "fc", {x, w});
  b.op1("gelu", "act", {y});
  const TensorId q = b.input("q", {2, 4, 8}, DType::kFloat32);
  b.op1("attention", "attn", {q, q, q}, graph::Attrs{{"d", int64_t{4}}});
  auto g = finish(b, y);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_DOUBLE_EQ(op_flops(op_named(*g, "fc")), 2.0 * 2 * 4 * 8 * 16);
  EXPECT_DOUBLE_EQ(op_flops(op_named(*g, "attn")), 4.0 * 2 * 4 * 4 * 2 * 4);  // b s t h d
  EXPECT_DOUBLE_EQ(op_flops(op_named(*g, "act")), 4.0 * 2 * 4 * 16);  // no rule: 4 x largest
}

TEST(OpRules, AUserOpSuppliesFlopsAndItsSplits) {
  graph::OpRegistry r = graph::OpRegistry::with_builtin_ops();
  graph::OpSchema mix = graph::OpSchema::simple("mix", "b s h, b s h -> b s h");
  mix.rules.flops = graph::flops_of_labels(7, {"b", "s", "h"});
  mix.rules.tensor_parallel = graph::tp_by_hint("h", "");
  mix.rules.sequence_parallel = true;
  ASSERT_TRUE(r.add(std::move(mix)).ok());
  graph::GraphBuilder b(r, "g");
  const TensorId x = b.input("x", {2, 4, 8}, DType::kFloat32);
  b.op1("mix", "column", {x, x}, graph::Attrs{{"tp", std::string("column")}});
  auto g = finish(b, b.op1("mix", "plain", {x, x}));
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_DOUBLE_EQ(op_flops(op_named(*g, "plain")), 7.0 * 2 * 4 * 8);
  EXPECT_EQ(tp_label(op_named(*g, "column"), false), "h");
  EXPECT_EQ(tp_label(op_named(*g, "plain"), false), "");
  EXPECT_EQ(tp_label(op_named(*g, "plain"), true), "s");  // sequence parallel
}

// The memo counts what op_flops counts; sub-ops of one type and shape whose attributes differ
// are counted apart (a memo keyed on type and shape alone would give the second the first's).
TEST(FlopsMemo, CountsAsOpFlopsAndTellsAttributesApart) {
  graph::OpRegistry r = graph::OpRegistry::with_builtin_ops();
  graph::OpSchema scaled = graph::OpSchema::simple("scaled", "b s h, b s h -> b s h");
  scaled.rules.flops = [](const graph::FlopsInput& in) {
    return static_cast<double>(in.attrs.get_or<int64_t>("k", 1)) * in.product();
  };
  ASSERT_TRUE(r.add(std::move(scaled)).ok());
  graph::GraphBuilder b(r, "g");
  const TensorId x = b.input("x", {2, 4, 8}, DType::kFloat32);
  const TensorId once = b.op1("scaled", "once", {x, x}, graph::Attrs{{"k", int64_t{1}}});
  const TensorId thrice = b.op1("scaled", "thrice", {once, x}, graph::Attrs{{"k", int64_t{3}}});
  auto g = finish(b, b.op1("scaled", "again", {thrice, x}, graph::Attrs{{"k", int64_t{1}}}));
  ASSERT_TRUE(g.ok()) << g.error().message;
  FlopsMemo memo;
  for (const char* name : {"once", "thrice", "again", "thrice", "once"})
    EXPECT_DOUBLE_EQ(memo(op_named(*g, name)), op_flops(op_named(*g, name))) << name;
  EXPECT_DOUBLE_EQ(memo(op_named(*g, "once")), 2.0 * 4 * 8);
  EXPECT_DOUBLE_EQ(memo(op_named(*g, "thrice")), 3.0 * 2 * 4 * 8);
}

// An op whose rules say its FLOPs depend on where its pieces lie (a ring attention step's) is
// counted per placement: the same shape further along the sequence is counted again.
TEST(FlopsMemo, CountsEachPlacementOfAnOpWhoseRulesAskForIt) {
  graph::OpRegistry r = graph::OpRegistry::with_builtin_ops();
  graph::OpSchema placed = graph::OpSchema::simple("placed", "b s h -> b s h");
  placed.rules.flops = [](const graph::FlopsInput& in) {
    const int64_t start = in.op ? in.op->inputs[0].ranges[1].start : 0;
    return static_cast<double>(1 + start) * in.product();
  };
  placed.rules.flops_by_position = true;
  ASSERT_TRUE(r.add(std::move(placed)).ok());
  graph::GraphBuilder b(r, "g");
  const TensorId x = b.input("x", {2, 4, 8}, DType::kFloat32);
  auto g = finish(b, b.op1("placed", "first", {x}));
  ASSERT_TRUE(g.ok()) << g.error().message;
  const graph::Op& first = op_named(*g, "first");
  graph::Op later = first;  // the same piece sizes, two positions along the sequence
  later.inputs[0].ranges[1] = {2, 6};
  FlopsMemo memo;
  EXPECT_DOUBLE_EQ(memo(first), 2.0 * 4 * 8);
  EXPECT_DOUBLE_EQ(memo(later), 3.0 * 2 * 4 * 8);
  EXPECT_DOUBLE_EQ(memo(first), 2.0 * 4 * 8);
}

}  // namespace
}  // namespace loom::planner
