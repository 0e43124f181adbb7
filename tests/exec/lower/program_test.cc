// Lowering GPT tiny plans to per-rank programs: every plan lowers, its programs cannot
// deadlock, gradient paths are the duals of the forward paths.
#include "exec/lower/program.h"

#include <gtest/gtest.h>

#include "models/model.h"

namespace loom::lower {
namespace {

struct Lowering {
  graph::Graph graph;
  Lowered lowered;
};

Lowering lower_plan(const std::vector<std::string>& overrides, int64_t world) {
  auto c = parse_config("model: {type: gpt, preset: tiny}\nbatch: {global: 8, micro: 2}\n", "l.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  auto g = models::build_plan(*c, graph::OpRegistry::with_builtin_ops(),
                              planner::PolicyRegistry::with_builtin_policies(), world);
  EXPECT_TRUE(g.ok()) << g.error().message;
  PathFinder paths;
  auto l = lower(*g, world, c->micro_batches(), paths);
  EXPECT_TRUE(l.ok()) << l.error().message;
  return {*g, l.ok() ? *l : Lowered{}};
}

int count(const Lowered& l, Primitive p, bool backward = false) {
  int n = 0;
  for (const Adapter& a : l.adapters)
    for (const CommStep& s : (backward ? a.backward : a.forward).steps) n += s.primitive == p;
  return n;
}

TEST(Lowering, SingleDeviceNeedsNoCommunication) {
  Lowering l = lower_plan({}, 1);
  EXPECT_TRUE(l.lowered.adapters.empty());
  EXPECT_TRUE(l.lowered.grad_syncs.empty());
  EXPECT_DOUBLE_EQ(l.lowered.programs[0].loss_seed, 1.0);
}

TEST(Lowering, DataParallelSyncsEveryParameter) {
  Lowering l = lower_plan({"parallel.dp=2"}, 2);
  EXPECT_TRUE(l.lowered.adapters.empty());  // each replica runs its half of the batch alone
  int params = 0;
  for (const auto& t : l.graph.tensors()) params += t.role == graph::TensorRole::kParameter;
  EXPECT_EQ(static_cast<int>(l.lowered.grad_syncs.size()), params);
  EXPECT_DOUBLE_EQ(l.lowered.programs[1].loss_seed, 1.0);  // the loss pieces are distinct chunks
}

TEST(Lowering, TensorParallelIsMegatronShaped) {
  Lowering l = lower_plan({"parallel.tp=2"}, 2);
  // Row-parallel outputs, the vocabulary-parallel embedding and the picked target logits are
  // summed; the group log-sum-exps are gathered.
  EXPECT_EQ(count(l.lowered, Primitive::kAllReduce), 2 * 2 + 1 + 1);
  EXPECT_EQ(count(l.lowered, Primitive::kAllGather), 1);
  // Their gradients: all-reduce stays all-reduce, all-gather becomes reduce-scatter.
  EXPECT_EQ(count(l.lowered, Primitive::kReduceScatter, true), 1);
  EXPECT_DOUBLE_EQ(l.lowered.programs[0].loss_seed, 0.5);  // the loss is replicated over tp
  std::string text = listing(l.graph, l.lowered, Rank(1));
  EXPECT_NE(text.find("comm h0.attn.proj for h0.attn.proj.bias: all_reduce with [0,1]"), std::string::npos) << text;
}

TEST(Lowering, SequenceParallelUsesReduceScatterAndAllGather) {
  Lowering l = lower_plan({"parallel.tp=2", "parallel.sp=true"}, 2);
  EXPECT_GE(count(l.lowered, Primitive::kReduceScatter), 4);
  EXPECT_GE(count(l.lowered, Primitive::kAllGather), 4);
  // q, k and v read the norm's output through one all-gather.
  std::string text = listing(l.graph, l.lowered, Rank(0));
  EXPECT_NE(text.find("comm h0.ln1 for h0.attn.q, h0.attn.k, h0.attn.v: all_gather with [0,1]"), std::string::npos) << text;
}

TEST(Lowering, PipelineStagesSendAndReceive) {
  Lowering l = lower_plan({"parallel.pp=2"}, 2);
  EXPECT_GE(count(l.lowered, Primitive::kSendRecv), 1);
  for (const Adapter& a : l.lowered.adapters) EXPECT_TRUE(a.cross_stage());
  EXPECT_DOUBLE_EQ(l.lowered.programs[0].loss_seed, 0.0);
  EXPECT_DOUBLE_EQ(l.lowered.programs[1].loss_seed, 1.0);
}

TEST(Lowering, EveryStandardPlanIsDeadlockFree) {
  const std::vector<std::pair<std::vector<std::string>, int64_t>> plans = {
      {{"parallel.dp=2", "parallel.tp=2"}, 4},
      {{"parallel.tp=2", "parallel.pp=2"}, 4},
      {{"parallel.dp=2", "parallel.pp=2"}, 4},
      {{"parallel.dp=2", "parallel.tp=2", "parallel.pp=2"}, 8},
      {{"parallel.dp=2", "parallel.tp=2", "parallel.pp=2", "parallel.sp=true"}, 8},
      {{"parallel.tp=4"}, 4},
      {{"parallel.pp=4", "model.args.layers=6"}, 4},
      {{"parallel.pp=2", "parallel.chunks=2", "model.args.layers=4"}, 2},
  };
  for (const auto& [overrides, world] : plans) {
    Lowering l = lower_plan(overrides, world);
    EXPECT_EQ(static_cast<int64_t>(l.lowered.programs.size()), world);
  }
}

TEST(Lowering, AnOrderThatWaitsForItselfIsADeadlock) {
  Lowering l = lower_plan({"parallel.pp=2"}, 2);
  // Rank 0 runs its backwards first and waits for a gradient, while rank 1 waits for the
  // activation rank 0 has not sent yet.
  auto& blocks0 = l.lowered.programs[0].blocks;
  std::rotate(blocks0.begin(), blocks0.begin() + static_cast<std::ptrdiff_t>(blocks0.size() / 2), blocks0.end());
  Status s = check_deadlock_free(l.graph, l.lowered);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("would deadlock"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("rank 0 waits at recv from rank 1 (step 0 of the gradient path of"),
            std::string::npos)
      << s.error().message;
}

TEST(GradLayout, SwapsReplicasAndValueChunks) {
  Layout l;
  l.r = 2;
  l.v = 1;
  l.d = {2};
  l.devices = {DeviceId(0), DeviceId(1), DeviceId(2), DeviceId(3)};
  Layout g = grad_layout(l);
  EXPECT_EQ(g.r, 1);
  EXPECT_EQ(g.v, 2);
  Shape shape{8};
  for (int64_t p = 0; p < 4; ++p) {
    auto it = std::find(g.devices.begin(), g.devices.end(), l.devices[p]);
    graph::SubTensor a = l.piece(p, TensorId(0), shape);
    graph::SubTensor b = g.piece(it - g.devices.begin(), TensorId(0), shape);
    EXPECT_EQ(a.ranges, b.ranges);  // same slice, now a value chunk
  }
  EXPECT_EQ(grad_layout(g), l);
}

}  // namespace
}  // namespace loom::lower
