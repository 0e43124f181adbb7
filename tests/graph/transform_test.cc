// partition / replicate / assign / stage on the annotations of the ops the issue names, each
// followed by the verifier, and every rejection.
#include "graph/transform.h"

#include <gtest/gtest.h>

#include "graph/builder.h"
#include "graph/verify.h"

namespace loom::graph {
namespace {

OpRegistry registry() {
  OpRegistry r = OpRegistry::with_builtin_ops();
  EXPECT_TRUE(r.add(OpSchema::simple("matmul", "m k+, k+ n -> m n")).ok());
  EXPECT_TRUE(r.add(OpSchema::simple("softmax", "b s h^ -> b s h^")).ok());
  EXPECT_TRUE(r.add(OpSchema::simple("sum2", "m+ n+ -> ")).ok());
  EXPECT_TRUE(r.add(OpSchema::simple("sum3", "a+ b+ c+ -> ")).ok());
  return r;
}

// One op of `type` on inputs of the given shapes, its output reduced to a scalar loss.
Graph one_op(const OpRegistry& r, const std::string& type, const std::vector<Shape>& shapes,
             Attrs attrs = {}, std::vector<DType> dtypes = {}) {
  GraphBuilder b(r, type);
  std::vector<TensorId> ins;
  for (size_t i = 0; i < shapes.size(); ++i)
    ins.push_back(b.input("in" + std::to_string(i), shapes[i],
                          i < dtypes.size() ? dtypes[i] : DType::kFloat32));
  TensorId y = b.op1(type, "op", ins, attrs);
  const FullTensor& t = b.tensor(y);
  if (t.shape.empty())
    b.set_loss(y);
  else
    b.set_loss(b.op1(t.shape.size() == 2 ? "sum2" : "sum3", "loss", {y}));
  auto g = b.finish();
  EXPECT_TRUE(g.ok()) << g.error().message;
  return *g;
}

Graph split(const Graph& g, const std::string& label, int64_t n) {
  auto out = partition(g, OpId(0), label, n);
  EXPECT_TRUE(out.ok()) << out.error().message;
  return out.ok() ? *out : g;
}

std::string split_error(const Graph& g, const std::string& label, int64_t n) {
  auto out = partition(g, OpId(0), label, n);
  EXPECT_FALSE(out.ok()) << "split on " << label << " accepted";
  return out.ok() ? "" : out.error().message;
}

TEST(Partition, MatmulPlainDimension) {
  OpRegistry r = registry();
  Graph g = one_op(r, "matmul", {{8, 6}, {6, 4}});
  Graph s = split(g, "m", 2);
  ASSERT_EQ(s.ops().size(), g.ops().size() + 1);
  EXPECT_EQ(s.ops()[0].inputs[0].ranges_string(), "[0:4, 0:6]");
  EXPECT_EQ(s.ops()[1].inputs[0].ranges_string(), "[4:8, 0:6]");
  EXPECT_EQ(s.ops()[1].inputs[1].ranges_string(), "[0:6, 0:4]");  // not split: read whole
  EXPECT_EQ(s.ops()[1].outputs[0].ranges_string(), "[4:8, 0:4]");
  EXPECT_EQ(s.ops()[1].name(), "op[1/2]");
  EXPECT_TRUE(verify(s, r).ok()) << verify(s, r).error().message;
}

TEST(Partition, MatmulReducedDimensionMakesValueChunks) {
  OpRegistry r = registry();
  Graph g = one_op(r, "matmul", {{8, 6}, {6, 4}});
  Graph s = split(g, "k", 3);
  EXPECT_EQ(s.ops()[2].inputs[0].ranges_string(), "[0:8, 4:6]");
  EXPECT_EQ(s.ops()[2].inputs[1].ranges_string(), "[4:6, 0:4]");
  EXPECT_EQ(s.ops()[2].outputs[0].ranges_string(), "[0:8, 0:4]/v2of3");
  EXPECT_TRUE(verify(s, r).ok());
  // Nested: split the first chunk again on m; chunk numbering nests.
  auto nested = partition(s, OpId(0), "k", 2);
  ASSERT_TRUE(nested.ok()) << nested.error().message;
  EXPECT_EQ(nested->ops()[1].outputs[0].ranges_string(), "[0:8, 0:4]/v1of6");
  EXPECT_TRUE(verify(*nested, r).ok());
}

TEST(Partition, LinearColumnAndRow) {
  OpRegistry r = registry();
  Graph g = one_op(r, "linear", {{2, 4, 6}, {8, 6}});
  Graph col = split(g, "n", 2);
  EXPECT_EQ(col.ops()[1].inputs[1].ranges_string(), "[4:8, 0:6]");
  EXPECT_EQ(col.ops()[1].outputs[0].ranges_string(), "[0:2, 0:4, 4:8]");
  EXPECT_TRUE(verify(col, r).ok());
  Graph row = split(g, "k", 2);
  EXPECT_EQ(row.ops()[1].inputs[0].ranges_string(), "[0:2, 0:4, 3:6]");
  EXPECT_EQ(row.ops()[1].outputs[0].ranges_string(), "[0:2, 0:4, 0:8]/v1of2");
  EXPECT_TRUE(verify(row, r).ok());
}

TEST(Partition, LayerNormAndSoftmax) {
  OpRegistry r = registry();
  Graph ln = one_op(r, "layer_norm", {{2, 4, 6}, {6}, {6}});
  Graph s = split(ln, "s", 4);
  EXPECT_EQ(s.ops()[3].inputs[0].ranges_string(), "[0:2, 3:4, 0:6]");
  EXPECT_EQ(s.ops()[3].inputs[1].ranges_string(), "[0:6]");
  EXPECT_TRUE(verify(s, r).ok());
  EXPECT_NE(split_error(ln, "h", 2).find("label 'h^' may not be split"), std::string::npos);
  Graph sm = one_op(r, "softmax", {{2, 4, 6}});
  EXPECT_TRUE(verify(split(sm, "b", 2), r).ok());
  EXPECT_NE(split_error(sm, "h", 3).find("may not be split"), std::string::npos);
}

TEST(Partition, AttentionSplitsWholeHeads) {
  OpRegistry r = registry();
  Graph g = one_op(r, "attention", {{2, 4, 12}, {2, 4, 12}, {2, 4, 12}}, Attrs{{"d", int64_t{3}}});
  Graph s = split(g, "h", 2);
  EXPECT_EQ(s.ops()[1].inputs[2].ranges_string(), "[0:2, 0:4, 6:12]");
  EXPECT_EQ(s.ops()[1].outputs[0].ranges_string(), "[0:2, 0:4, 6:12]");
  EXPECT_TRUE(verify(s, r).ok());
  EXPECT_NE(split_error(g, "h", 3).find("label 'h' has size 4, not divisible by 3"),
            std::string::npos);
  EXPECT_NE(split_error(g, "s", 2).find("may not be split"), std::string::npos);
  EXPECT_NE(split_error(g, "d", 2).find("may not be split"), std::string::npos);
}

TEST(Partition, EmbeddingAndCrossEntropy) {
  OpRegistry r = registry();
  Graph emb = one_op(r, "embedding", {{2, 4}, {10, 6}}, {}, {DType::kInt64});
  Graph v = split(emb, "v", 2);
  EXPECT_EQ(v.ops()[1].inputs[1].ranges_string(), "[5:10, 0:6]");
  EXPECT_EQ(v.ops()[1].outputs[0].ranges_string(), "[0:2, 0:4, 0:6]/v1of2");
  EXPECT_TRUE(verify(v, r).ok());
  Graph ce = one_op(r, "cross_entropy", {{2, 4, 10}, {2, 4}}, Attrs{{"normalizer", int64_t{8}}},
                    {DType::kFloat32, DType::kInt64});
  Graph b = split(ce, "b", 2);
  EXPECT_EQ(b.ops()[1].inputs[1].ranges_string(), "[1:2, 0:4]");
  EXPECT_EQ(b.ops()[1].outputs[0].ranges_string(), "[]/v1of2");
  EXPECT_TRUE(verify(b, r).ok());
  EXPECT_NE(split_error(ce, "v", 2).find("may not be split"), std::string::npos);
}

TEST(Partition, Rejections) {
  OpRegistry r = registry();
  Graph g = one_op(r, "matmul", {{1024, 6}, {6, 4}});
  std::string e = split_error(g, "m", 3);
  EXPECT_NE(
      e.find("cannot split op 'op' (matmul) 3 ways: label 'm' has size 1024, not divisible by 3"),
      std::string::npos)
      << e;
  EXPECT_NE(split_error(g, "q", 2).find("has no label 'q'"), std::string::npos);
  EXPECT_NE(split_error(g, "m", 0).find("must be positive"), std::string::npos);
  EXPECT_FALSE(partition(g, OpId(99), "m", 2).ok());
}

TEST(Replicate, CopiesAndVerifies) {
  OpRegistry r = registry();
  Graph g = one_op(r, "softmax", {{2, 4, 6}});
  auto rep = replicate(g, OpId(0), 3);
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->ops()[2].name(), "op[2/3]");
  EXPECT_EQ(rep->ops()[2].outputs[0], rep->ops()[0].outputs[0]);
  EXPECT_TRUE(verify(*rep, r).ok());
  EXPECT_FALSE(replicate(g, OpId(0), 0).ok());
}

TEST(AssignAndStage, SetDeviceAndStage) {
  OpRegistry r = registry();
  Graph g = one_op(r, "softmax", {{2, 4, 6}});
  auto a = assign(g, OpId(0), DeviceId(3));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ops()[0].device, DeviceId(3));
  EXPECT_FALSE(assign(g, OpId(0), DeviceId()).ok());
  auto s = stage(*a, {OpId(0), OpId(1)}, StageId(2));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->ops()[1].stage, StageId(2));
  EXPECT_FALSE(stage(g, {OpId(42)}, StageId(1)).ok());
}

TEST(Verify, RejectsAPieceNobodyWrites) {
  OpRegistry r = registry();
  Graph g = one_op(r, "matmul", {{8, 6}, {6, 4}});
  Graph s = split(g, "m", 2);
  s.mutable_ops().erase(s.mutable_ops().begin() + 1);  // drop the second half's producer
  Status v = verify(s, r);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().message.find("no ops write enough of 'op'"), std::string::npos)
      << v.error().message;
  Graph k = split(g, "k", 2);
  k.mutable_ops().erase(k.mutable_ops().begin());  // one of two partial sums is missing
  EXPECT_FALSE(verify(k, r).ok());
}

}  // namespace
}  // namespace loom::graph
