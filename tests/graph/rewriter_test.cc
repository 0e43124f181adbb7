// The checked transforms (graph/rewriter.h): each transform is checked on the ops and tensors it
// touched, and a failure names the pass, the transform and the op.
#include "graph/rewriter.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "graph/builder.h"
#include "graph/transform.h"
#include "graph/verify.h"

namespace loom::graph {
namespace {

OpRegistry registry() {
  OpRegistry r = OpRegistry::with_builtin_ops();
  EXPECT_TRUE(r.add(OpSchema::simple("matmul", "m k+, k+ n -> m n")).ok());
  EXPECT_TRUE(r.add(OpSchema::simple("sum2", "m+ n+ -> ")).ok());
  return r;
}

// x [8, 6] @ w [6, 4] -> y, summed into the loss.
Graph matmul(const OpRegistry& r) {
  GraphBuilder b(r, "mm");
  TensorId x = b.input("x", {8, 6}, DType::kFloat32);
  TensorId w = b.input("w", {6, 4}, DType::kFloat32);
  TensorId y = b.op1("matmul", "mm", {x, w});
  b.set_loss(b.op1("sum2", "loss", {y}));
  auto g = b.finish();
  EXPECT_TRUE(g.ok()) << g.error().message;
  return *g;
}

std::string error_of(const Result<std::vector<Op>>& r) {
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : r.error().message;
}

TEST(Rewriter, PartitionAndReplicateAreCheckedAndPassThrough) {
  OpRegistry r = registry();
  Graph g = matmul(r);
  Rewriter rw(g, "test pass", VerifyMode::kEachTransform);
  for (const char* label : {"m", "k", "n"}) {
    auto parts = rw.partition(g.ops()[0], label, 2);
    ASSERT_TRUE(parts.ok()) << parts.error().message;
    auto plain = split_op(g.ops()[0], label, 2);
    ASSERT_EQ(parts->size(), 2u);
    EXPECT_EQ((*parts)[1].outputs, (*plain)[1].outputs);
  }
  auto copies = rw.replicate(g.ops()[0], 3);
  ASSERT_TRUE(copies.ok());
  EXPECT_EQ(copies->size(), 3u);
  // The annotation's refusals stay split_op's own.
  EXPECT_NE(error_of(rw.partition(g.ops()[0], "m", 3)).find("cannot split op 'mm' (matmul) 3 ways"),
            std::string::npos);
}

TEST(Rewriter, APartMissingLeavesTheOutputUnproducible) {
  OpRegistry r = registry();
  Graph g = matmul(r);
  auto halves_but_one = [](const Op& op) -> Result<std::vector<Op>> {
    LOOM_ASSIGN_OR_RETURN(auto parts, split_op(op, "m", 2));
    parts.pop_back();
    return parts;
  };
  Rewriter rw(g, "test pass", VerifyMode::kEachTransform);
  EXPECT_EQ(error_of(rw.rewrite("partition", "dim m, 2", g.ops()[0], halves_but_one)),
            "test pass: partition(op 'mm', dim m, 2) left 'mm' unproducible: the parts write "
            "[0:4, 0:4] of the piece [0:8, 0:4] the op wrote");
  // One of two partial sums is missing too.
  auto one_chunk = [](const Op& op) -> Result<std::vector<Op>> {
    LOOM_ASSIGN_OR_RETURN(auto parts, split_op(op, "k", 2));
    return std::vector<Op>{parts[1]};
  };
  EXPECT_NE(error_of(rw.rewrite("partition", "dim k, 2", g.ops()[0], one_chunk))
                .find("left 'mm' unproducible: the parts write [0:8, 0:4]/v1of2 of the piece"),
            std::string::npos);
  // Unchecked, the same transform goes through; the whole-graph verifier finds it later.
  Rewriter off(g, "test pass", VerifyMode::kOff);
  auto unchecked = off.rewrite("partition", "dim m, 2", g.ops()[0], halves_but_one);
  ASSERT_TRUE(unchecked.ok());
  Graph broken = g;
  broken.mutable_ops().erase(broken.mutable_ops().begin());
  broken.mutable_ops().insert(broken.mutable_ops().begin(), (*unchecked)[0]);
  EXPECT_FALSE(verify(broken, r).ok());
}

TEST(Rewriter, APartThatBreaksItsAnnotationOrReadsElsewhereFails) {
  OpRegistry r = registry();
  Graph g = matmul(r);
  Rewriter rw(g, "test pass", VerifyMode::kEachTransform);
  // Splits x along m but w along n: the output no longer has the shape the inputs imply.
  auto wrong_dim = [](const Op& op) -> Result<std::vector<Op>> {
    LOOM_ASSIGN_OR_RETURN(auto parts, split_op(op, "m", 2));
    for (size_t i = 0; i < parts.size(); ++i) {
      const int64_t at = static_cast<int64_t>(i) * 2;
      parts[i].inputs[1].ranges[1] = Range{at, at + 2};
    }
    return parts;
  };
  const std::string e = error_of(rw.rewrite("partition", "dim m, 2", g.ops()[0], wrong_dim));
  EXPECT_EQ(e.rfind("test pass: partition(op 'mm', dim m, 2): op 'mm[0/2]' (matmul): output 'mm' "
                    "piece [0:4, 0:4] does not have the shape [4, 2] its inputs imply",
                    0),
            0u)
      << e;
  // A rewrite of the first half of the rows that reads the second half of x.
  auto top = split_op(g.ops()[0], "m", 2);
  ASSERT_TRUE(top.ok());
  auto reads_elsewhere = [](const Op& op) -> Result<std::vector<Op>> {
    Op moved = op;
    moved.inputs[0].ranges[0] = Range{4, 8};
    return std::vector<Op>{moved};
  };
  EXPECT_EQ(error_of(rw.rewrite("shift", "", (*top)[0], reads_elsewhere)),
            "test pass: shift(op 'mm[0/2]'): part 'mm[0/2]' reads [4:8, 0:6] of 'x', outside the "
            "piece [0:4, 0:6] of 'x' the op read");
}

TEST(Rewriter, AssignStageAndWholeGraphTransforms) {
  OpRegistry r = registry();
  Graph g = matmul(r);
  Rewriter rw(g, "test pass", VerifyMode::kEachTransform);
  Op op = g.ops()[0];
  EXPECT_TRUE(rw.assign(op, DeviceId(3), 4).ok());
  EXPECT_EQ(op.device, DeviceId(3));
  Status off = rw.assign(op, DeviceId(4), 4);
  ASSERT_FALSE(off.ok());
  EXPECT_EQ(off.error().message, "test pass: assign(op 'mm', device 4): the plan has 4 devices");
  EXPECT_TRUE(rw.stage(op, StageId(1), 2).ok());
  EXPECT_EQ(op.stage, StageId(1));
  EXPECT_FALSE(rw.stage(op, StageId(2), 2).ok());

  auto kept = rw.apply("identity", g, [](const Graph& in) -> Result<Graph> { return in; });
  EXPECT_TRUE(kept.ok());
  auto dropped = rw.apply("drop the matmul", g, [](const Graph& in) -> Result<Graph> {
    Graph out = in;
    out.mutable_ops().erase(out.mutable_ops().begin());
    return out;
  });
  ASSERT_FALSE(dropped.ok());
  EXPECT_EQ(
      dropped.error().message.rfind("test pass: drop the matmul: op 'loss' (sum2): reads 'mm'", 0),
      0u)
      << dropped.error().message;
}

TEST(Rewriter, TheEnvironmentSwitchesTheDefault) {
  ASSERT_EQ(setenv("LOOM_VERIFY_EACH_TRANSFORM", "1", 1), 0);
  EXPECT_EQ(default_verify_mode(), VerifyMode::kEachTransform);
  ASSERT_EQ(setenv("LOOM_VERIFY_EACH_TRANSFORM", "0", 1), 0);
  EXPECT_EQ(default_verify_mode(), VerifyMode::kOff);
  ASSERT_EQ(unsetenv("LOOM_VERIFY_EACH_TRANSFORM"), 0);
#ifdef NDEBUG
  EXPECT_EQ(default_verify_mode(), VerifyMode::kOff);
#else
  EXPECT_EQ(default_verify_mode(), VerifyMode::kEachTransform);
#endif
}

}  // namespace
}  // namespace loom::graph
