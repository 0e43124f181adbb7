#include "graph/annotation.h"

#include <gtest/gtest.h>

namespace loom::graph {
namespace {

Annotation parse_ok(const std::string& text) {
  auto a = Annotation::parse(text);
  EXPECT_TRUE(a.ok()) << text << ": " << (a.ok() ? "" : a.error().message);
  return a.ok() ? *a : Annotation();
}

std::string parse_error(const std::string& text) {
  auto a = Annotation::parse(text);
  EXPECT_FALSE(a.ok()) << "accepted: " << text;
  return a.ok() ? "" : a.error().message;
}

TEST(Annotation, Matmul) {
  Annotation a = parse_ok("m k+, k+ n -> m n");
  ASSERT_EQ(a.inputs().size(), 2u);
  ASSERT_EQ(a.outputs().size(), 1u);
  EXPECT_EQ(a.labels(), (std::vector<std::string>{"m", "k", "n"}));
  EXPECT_EQ(a.kind_of("k"), LabelKind::kReduce);
  EXPECT_EQ(a.kind_of("m"), LabelKind::kSplit);
  EXPECT_EQ(a.sites("k").size(), 2u);
  EXPECT_EQ(a.to_string(), "m k+, k+ n -> m n");
}

TEST(Annotation, LayerNormFrozen) {
  Annotation a = parse_ok("b s h^, h^, h^ -> b s h^");
  EXPECT_EQ(a.kind_of("h"), LabelKind::kFrozen);
  EXPECT_EQ(a.inputs()[1].dims.size(), 1u);
}

TEST(Annotation, GroupsAndLiterals) {
  Annotation a = parse_ok("b s^ (h d^), b t^ (h d^) -> b s^ (h d^) 1");
  const DimSpec& g = a.inputs()[0].dims[2];
  ASSERT_EQ(g.labels.size(), 2u);
  EXPECT_EQ(g.labels[0].name, "h");
  EXPECT_EQ(g.labels[1].kind, LabelKind::kFrozen);
  EXPECT_EQ(a.outputs()[0].dims[3].labels[0].kind, LabelKind::kFixed);
  EXPECT_EQ(a.outputs()[0].dims[3].labels[0].size, 1);
  EXPECT_EQ(parse_ok(a.to_string()), a);
}

TEST(Annotation, ScalarOutput) {
  Annotation a = parse_ok("b+ s+ v^, b+ s+ -> ");
  ASSERT_EQ(a.outputs().size(), 1u);
  EXPECT_TRUE(a.outputs()[0].dims.empty());
}

TEST(Annotation, RejectsMalformed) {
  EXPECT_NE(parse_error("m k, k n").find("missing '->'"), std::string::npos);
  EXPECT_NE(parse_error("m k -> m -> k").find("more than one"), std::string::npos);
  EXPECT_NE(parse_error("m k* -> m").find("unknown suffix"), std::string::npos);
  EXPECT_NE(parse_error("m (k n -> m").find("unclosed"), std::string::npos);
  EXPECT_NE(parse_error("m k) -> m").find("unmatched"), std::string::npos);
  EXPECT_NE(parse_error("((a b)) -> a").find("nested"), std::string::npos);
  EXPECT_NE(parse_error("() -> a").find("empty group"), std::string::npos);
  EXPECT_NE(parse_error("a 0 -> a").find("positive"), std::string::npos);
  EXPECT_NE(parse_error("a 3x -> a").find("neither a name nor an integer"), std::string::npos);
  EXPECT_NE(parse_error("$a -> a").find("unexpected"), std::string::npos);
}

TEST(Annotation, RejectsInconsistentLabels) {
  EXPECT_NE(parse_error("m k+, k n -> m n").find("label 'k' is marked"), std::string::npos);
  EXPECT_NE(parse_error("m k+ -> m k").find("marked"), std::string::npos);
  EXPECT_NE(parse_error("m k+, k+ -> k+").find("cannot appear in an output"), std::string::npos);
  EXPECT_NE(parse_error("m m -> m").find("appears twice"), std::string::npos);
  EXPECT_NE(parse_error("(h d) -> (h d)").find("only the first label may be split"),
            std::string::npos);
  EXPECT_NE(parse_error(" -> a").find("at least one input"), std::string::npos);
}

}  // namespace
}  // namespace loom::graph
