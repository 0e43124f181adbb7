#include "graph/builder.h"

#include <gtest/gtest.h>

#include "graph/dump.h"
#include "graph/verify.h"

namespace loom::graph {
namespace {

Result<Graph> tiny_mlp(const OpRegistry& r, int64_t hidden_in = 8) {
  GraphBuilder b(r, "mlp");
  TensorId x = b.input("x", {2, 4, hidden_in}, DType::kFloat32);
  TensorId w = b.parameter("w", {16, 8}, ParamInit::normal(0.02));
  TensorId y = b.op1("linear", "fc", {x, w});
  y = b.op1("gelu", "act", {y});
  TensorId targets = b.input("targets", {2, 4}, DType::kInt64);
  TensorId loss = b.op1("cross_entropy", "loss", {y, targets}, Attrs{{"normalizer", int64_t{8}}});
  b.set_loss(loss);
  return b.finish();
}

TEST(GraphBuilder, BuildsVerifiesAndDumps) {
  OpRegistry r = OpRegistry::with_builtin_ops();
  auto g = tiny_mlp(r);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(g->ops().size(), 3u);
  EXPECT_EQ(g->tensor(*g->find_tensor("fc")).shape, (Shape{2, 4, 16}));
  EXPECT_TRUE(verify(*g, r).ok());
  const std::string expected =
      "graph mlp: 6 tensors, 3 ops, loss %5\n"
      "  %0 x f32[2, 4, 8] input\n"
      "  %1 w f32[16, 8] param normal(0.02)\n"
      "  %2 fc f32[2, 4, 16] act\n"
      "  %3 act f32[2, 4, 16] act\n"
      "  %4 targets i64[2, 4] input\n"
      "  %5 loss f32[] loss\n"
      "  #0 linear fc dev 0 stage 0 layer pre {b s k+, n k+ -> b s n}\n"
      "      %0[0:2, 0:4, 0:8], %1[0:16, 0:8] -> %2[0:2, 0:4, 0:16]\n"
      "  #1 gelu act dev 0 stage 0 layer pre {b s h -> b s h}\n"
      "      %2[0:2, 0:4, 0:16] -> %3[0:2, 0:4, 0:16]\n"
      "  #2 cross_entropy loss dev 0 stage 0 layer pre {b+ s+ v^, b+ s+ -> } {normalizer=8}\n"
      "      %3[0:2, 0:4, 0:16], %4[0:2, 0:4] -> %5[]\n";
  EXPECT_EQ(dump(*g), expected);
}

TEST(GraphBuilder, FirstErrorWinsAndNamesTheOp) {
  OpRegistry r = OpRegistry::with_builtin_ops();
  auto g = tiny_mlp(r, 9);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("op 'fc' (linear)"), std::string::npos) << g.error().message;
}

TEST(GraphBuilder, RejectsNonScalarLossAndMissingLoss) {
  OpRegistry r = OpRegistry::with_builtin_ops();
  GraphBuilder b(r, "g");
  TensorId x = b.input("x", {2, 3}, DType::kFloat32);
  b.set_loss(x);
  auto g = b.finish();
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("must be a scalar"), std::string::npos);
  GraphBuilder b2(r, "g2");
  b2.input("x", {2, 3}, DType::kFloat32);
  EXPECT_NE(b2.finish().error().message.find("has no loss"), std::string::npos);
}

// Copies share their tensors and ops until one changes (graph.h): every change stays in the
// graph it was made to, and a moved-from graph reads as empty.
TEST(Graph, CopiesAreIndependent) {
  OpRegistry r = OpRegistry::with_builtin_ops();
  auto built = tiny_mlp(r);
  ASSERT_TRUE(built.ok()) << built.error().message;
  const Graph g = *built;
  const std::string before = dump(g);

  Graph a = g;
  a.mutable_ops()[0].device = DeviceId(3);
  a.mutable_tensor(*a.find_tensor("fc")).dtype = DType::kBFloat16;
  FullTensor extra;
  extra.name = "extra";
  extra.shape = {2};
  a.add_tensor(extra);
  a.add_op(a.ops()[1]);
  EXPECT_EQ(dump(g), before);
  EXPECT_EQ(a.ops().size(), 4u);
  EXPECT_EQ(a.ops()[0].device, DeviceId(3));
  EXPECT_TRUE(a.find_tensor("extra").has_value());
  EXPECT_FALSE(g.find_tensor("extra").has_value());

  Graph b = g;
  b.reset_ops();
  EXPECT_TRUE(b.ops().empty());
  EXPECT_EQ(b.tensors().size(), g.tensors().size());
  EXPECT_EQ(dump(g), before);

  Graph c = g;
  Graph d = c;  // c's copy, then c changes
  c.set_loss(*c.find_tensor("act"));
  EXPECT_EQ(dump(d), before);
  EXPECT_EQ(dump(g), before);

  Graph moved = g;
  Graph into = std::move(moved);
  EXPECT_EQ(dump(into), before);
  EXPECT_TRUE(moved.ops().empty());  // NOLINT(bugprone-use-after-move): reads as empty
  EXPECT_TRUE(moved.tensors().empty());
  EXPECT_FALSE(moved.find_tensor("fc").has_value());
}

TEST(Verify, CatchesPiecesThatBreakTheAnnotation) {
  OpRegistry r = OpRegistry::with_builtin_ops();
  auto g = tiny_mlp(r);
  ASSERT_TRUE(g.ok());
  Graph broken = *g;
  broken.mutable_ops()[0].inputs[1].ranges[1] = {0, 4};  // weight piece no longer matches k
  Status s = verify(broken, r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("op 'fc'"), std::string::npos) << s.error().message;
  Graph reordered = *g;
  std::swap(reordered.mutable_ops()[0], reordered.mutable_ops()[1]);
  Status s2 = verify(reordered, r);
  ASSERT_FALSE(s2.ok());
  EXPECT_NE(s2.error().message.find("before any op writes it"), std::string::npos);
}

}  // namespace
}  // namespace loom::graph
