#include "graph/op_registry.h"

#include <gtest/gtest.h>

namespace loom::graph {
namespace {

TEST(OpRegistry, BuiltinAnnotationsParse) {
  OpRegistry r = OpRegistry::with_builtin_ops();
  for (const std::string& type : r.types()) {
    auto a = r.annotation_of(type, Attrs{});
    EXPECT_TRUE(a.ok()) << type << ": " << (a.ok() ? "" : a.error().message);
  }
  EXPECT_EQ(r.annotation_of("linear", Attrs{})->to_string(), "b s k+, n k+ -> b s n");
  EXPECT_EQ(r.annotation_of("linear", Attrs{{"ndim", int64_t{2}}})->to_string(),
            "b k+, n k+ -> b n");
}

TEST(OpRegistry, InfersShapesFromAnnotations) {
  OpRegistry r = OpRegistry::with_builtin_ops();
  EXPECT_EQ(*r.infer_shapes("linear", {{2, 8, 16}, {32, 16}}, {}),
            (std::vector<Shape>{{2, 8, 32}}));
  EXPECT_EQ(*r.infer_shapes("embedding", {{2, 8}, {100, 16}}, {}),
            (std::vector<Shape>{{2, 8, 16}}));
  EXPECT_EQ(*r.infer_shapes("layer_norm", {{2, 8, 16}, {16}, {16}}, {}),
            (std::vector<Shape>{{2, 8, 16}}));
  EXPECT_EQ(
      *r.infer_shapes("attention", {{2, 8, 16}, {2, 8, 16}, {2, 8, 16}}, Attrs{{"d", int64_t{4}}}),
      (std::vector<Shape>{{2, 8, 16}}));
  EXPECT_EQ(*r.infer_shapes("cross_entropy", {{2, 8, 100}, {2, 8}}, {}), (std::vector<Shape>{{}}));
  EXPECT_EQ(r.infer_dtypes("embedding", {DType::kInt64, DType::kFloat32}, {})[0], DType::kFloat32);
}

TEST(OpRegistry, ShapeErrorsNameTheLabel) {
  OpRegistry r = OpRegistry::with_builtin_ops();
  auto mismatch = r.infer_shapes("linear", {{2, 8, 16}, {32, 15}}, {});
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.error().message.find("'k+' is 16 elsewhere"), std::string::npos)
      << mismatch.error().message;
  auto rank = r.infer_shapes("linear", {{2, 16}, {32, 16}}, {});
  ASSERT_FALSE(rank.ok());
  EXPECT_NE(rank.error().message.find("dimensions"), std::string::npos);
  auto heads = r.infer_shapes("attention", {{2, 8, 16}, {2, 8, 16}, {2, 8, 16}}, {});
  ASSERT_FALSE(heads.ok());
  EXPECT_NE(heads.error().message.find("cannot be inferred"), std::string::npos)
      << heads.error().message;
  auto indivisible =
      r.infer_shapes("attention", {{2, 8, 18}, {2, 8, 18}, {2, 8, 18}}, Attrs{{"d", int64_t{4}}});
  ASSERT_FALSE(indivisible.ok());
  EXPECT_NE(indivisible.error().message.find("not divisible"), std::string::npos);
  auto arity = r.infer_shapes("linear", {{2, 8, 16}}, {});
  ASSERT_FALSE(arity.ok());
  EXPECT_NE(arity.error().message.find("takes 2 inputs"), std::string::npos);
}

TEST(OpRegistry, CustomOpGetsShapesForFree) {
  OpRegistry fresh = OpRegistry::with_builtin_ops();
  ASSERT_TRUE(fresh.add(OpSchema::simple("outer", "a, b -> a b")).ok());
  EXPECT_EQ(*fresh.infer_shapes("outer", {{3}, {5}}, {}), (std::vector<Shape>{{3, 5}}));
  Status dup = fresh.add(OpSchema::simple("outer", "a, b -> a b"));
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.error().message.find("already registered"), std::string::npos);
  Status bad = fresh.add(OpSchema::simple("broken", "a b"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("missing '->'"), std::string::npos);
  auto unknown = fresh.annotation_of("linaer", {});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("did you mean 'linear'"), std::string::npos);
}

}  // namespace
}  // namespace loom::graph
