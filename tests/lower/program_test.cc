// Lowering GPT tiny plans to per-rank programs: every plan lowers, its programs cannot
// deadlock, gradient paths are the duals of the forward paths.
#include "lower/program.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <set>

#include "lower/backward_comm.h"
#include "lower/schedule_order.h"
#include "models/model.h"
#include "plan/plan.h"
#include "tests/support/plan_chain.h"

namespace loom::lower {
namespace {

struct Lowering {
  graph::Graph graph;
  Lowered lowered;
};

Lowering lower_plan(const std::vector<std::string>& overrides, int64_t world,
                    bool scheduled = false) {
  auto c = parse_config("model: {type: gpt, preset: tiny}\nbatch: {global: 8, micro: 2}\n",
                        "l.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  auto g = loom::plan::planned_graph(*c, loom::plan::Registries{}, world);
  EXPECT_TRUE(g.ok()) << g.error().message;
  PathFinder paths;
  std::vector<std::vector<ProgramBlock>> order;
  if (scheduled) {
    auto o = testing_support::pipeline_order_of(*c, c->micro_batches());
    EXPECT_TRUE(o.ok()) << o.error().message;
    if (o.ok()) order = o->ranks;
  }
  auto l = lower(*g, world, c->micro_batches(), paths, scheduled ? &order : nullptr);
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
  EXPECT_NE(text.find("comm h0.attn.proj for h0.attn.proj.bias: all_reduce with [0,1]"),
            std::string::npos)
      << text;
}

TEST(Lowering, SequenceParallelUsesReduceScatterAndAllGather) {
  Lowering l = lower_plan({"parallel.tp=2", "parallel.sp=true"}, 2);
  EXPECT_GE(count(l.lowered, Primitive::kReduceScatter), 4);
  EXPECT_GE(count(l.lowered, Primitive::kAllGather), 4);
  // q, k and v read the norm's output through one all-gather.
  std::string text = listing(l.graph, l.lowered, Rank(0));
  EXPECT_NE(text.find("comm h0.ln1 for h0.attn.q, h0.attn.k, h0.attn.v: all_gather with [0,1]"),
            std::string::npos)
      << text;
}

TEST(Lowering, PipelineStagesSendAndReceive) {
  Lowering l = lower_plan({"parallel.pp=2"}, 2);
  EXPECT_GE(count(l.lowered, Primitive::kSendRecv), 1);
  for (const Adapter& a : l.lowered.adapters) EXPECT_TRUE(a.cross_stage());
  EXPECT_DOUBLE_EQ(l.lowered.programs[0].loss_seed, 0.0);
  EXPECT_DOUBLE_EQ(l.lowered.programs[1].loss_seed, 1.0);
}

// The exchanges a backward pass waits for, as the trainer finds them (with the local backend on
// a GPU they would stall, lower/backward_comm.h): tensor and sequence parallelism's gradient
// collectives and ZeRO 3's gathers are found and named; the pipeline's transfers and the
// data-parallel gradient sums run outside the backward pass.
std::optional<std::string> exchange_of_plan(const std::vector<std::string>& overrides) {
  auto c = parse_config("model: {type: gpt, preset: tiny}\nbatch: {global: 8, micro: 2}\n",
                        "l.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  auto made = loom::plan::make_plan(*c);
  EXPECT_TRUE(made.ok()) << made.error().message;
  if (!made.ok()) return "no plan";
  return exchange_in_backward(made->file.graph, made->file.lowered);
}

TEST(Lowering, ExchangesInsideTheBackwardPassAreFound) {
  EXPECT_EQ(exchange_of_plan({}), std::nullopt);
  EXPECT_EQ(exchange_of_plan({"parallel.dp=2"}), std::nullopt);
  EXPECT_EQ(exchange_of_plan({"parallel.dp=2", "parallel.zero=1"}), std::nullopt);
  EXPECT_EQ(exchange_of_plan({"parallel.pp=2", "parallel.schedule=1f1b"}), std::nullopt);
  EXPECT_EQ(exchange_of_plan({"parallel.dp=2", "parallel.pp=2"}), std::nullopt);
  const auto tp = exchange_of_plan({"parallel.tp=2"});
  ASSERT_TRUE(tp.has_value());
  EXPECT_NE(tp->find("all_reduce of tensor '"), std::string::npos) << *tp;
  EXPECT_NE(tp->find("in its gradient path"), std::string::npos) << *tp;
  const auto sp = exchange_of_plan({"parallel.tp=2", "parallel.sp=true"});
  ASSERT_TRUE(sp.has_value());
  const auto zero3 = exchange_of_plan({"parallel.dp=2", "parallel.zero=3"});
  ASSERT_TRUE(zero3.has_value());
  EXPECT_NE(zero3->find("(parallel.zero 3)"), std::string::npos) << *zero3;
  // Within a pipeline stage, tensor parallelism's exchanges are still found.
  EXPECT_TRUE(exchange_of_plan({"parallel.tp=2", "parallel.pp=2"}).has_value());
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

// Chimera over 4 pipeline ranks: rank r runs stage r of the down pipeline and stage 3-r of the
// up pipeline (numbered 4 + 3-r), even micro-batches down and odd ones up; every parameter piece
// is held by the two ranks that run its stage in either direction, and each pipeline's last
// stage seeds its own loss.
TEST(Lowering, ChimeraRunsTwoPipelinesInOppositeDirections) {
  Lowering l =
      lower_plan({"parallel.pp=4", "parallel.schedule=chimera", "model.args.layers=4"}, 4, true);
  ASSERT_EQ(l.lowered.programs.size(), 4u);
  for (int64_t r = 0; r < 4; ++r) {
    const Program& prog = l.lowered.programs[static_cast<size_t>(r)];
    ASSERT_EQ(prog.segments.size(), 2u) << "rank " << r;
    EXPECT_EQ(prog.segments[0].stage, StageId(r));
    EXPECT_EQ(prog.segments[1].stage, StageId(4 + 3 - r));
    for (const ProgramBlock& b : prog.blocks)
      EXPECT_EQ(b.stage, b.micro_batch.value() % 2 == 0 ? StageId(r) : StageId(7 - r))
          << "rank " << r << " micro-batch " << b.micro_batch.value();
    EXPECT_EQ(prog.blocks.size(), 2u * 4u);  // F and B of 4 micro-batches, each in one direction
    EXPECT_DOUBLE_EQ(prog.loss_seed, r == 0 || r == 3 ? 1.0 : 0.0) << "rank " << r;
  }
  int params = 0;
  for (const auto& t : l.graph.tensors()) params += t.role == graph::TensorRole::kParameter;
  EXPECT_EQ(static_cast<int>(l.lowered.grad_syncs.size()), params);
  for (const GradSync& s : l.lowered.grad_syncs) {
    ASSERT_EQ(s.devices.size(), 2u);
    EXPECT_EQ(s.devices[0].value() + s.devices[1].value(), 3) << l.graph.tensor(s.tensor).name;
  }
  for (const Adapter& a : l.lowered.adapters) {
    EXPECT_TRUE(a.cross_stage());
    EXPECT_EQ(a.producer_stage.value() < 4, a.consumer_stage.value() < 4)
        << "adapter " << a.id << " crosses between the pipelines";
  }
}

TEST(Lowering, ChimeraNeedsAnEvenPipeline) {
  auto c =
      parse_config("model: {type: gpt, preset: tiny}\nbatch: {global: 6, micro: 2}\n", "l.yaml",
                   {"parallel.pp=3", "parallel.schedule=chimera", "model.args.layers=3"});
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto g = loom::plan::planned_graph(*c, loom::plan::Registries{}, 3);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("parallel.pp"), std::string::npos) << g.error().message;
  EXPECT_NE(g.error().message.find("even"), std::string::npos) << g.error().message;
}

TEST(Lowering, AnOrderThatWaitsForItselfIsADeadlock) {
  Lowering l = lower_plan({"parallel.pp=2"}, 2);
  // Rank 0 runs its backwards first and waits for a gradient, while rank 1 waits for the
  // activation rank 0 has not sent yet.
  auto& blocks0 = l.lowered.programs[0].blocks;
  std::rotate(blocks0.begin(), blocks0.begin() + static_cast<std::ptrdiff_t>(blocks0.size() / 2),
              blocks0.end());
  Status s = check_deadlock_free(l.graph, l.lowered);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("would deadlock"), std::string::npos) << s.error().message;
  EXPECT_NE(
      s.error().message.find("rank 0 waits at recv from rank 1 (step 0 of the gradient path of"),
      std::string::npos)
      << s.error().message;
}

// ZB-H1 over 2 pipeline ranks: every backward is split into an input-gradient block (I, with the
// backward's communication) and a weight-gradient block (W, none), both in the listing; W blocks
// moved anywhere leave the programs deadlock-free, as they communicate nothing.
TEST(Lowering, ZbH1SplitsEveryBackwardIntoIAndW) {
  Lowering l = lower_plan({"parallel.pp=2", "parallel.schedule=zb-h1"}, 2, true);
  for (int64_t r = 0; r < 2; ++r) {
    const Program& prog = l.lowered.programs[static_cast<size_t>(r)];
    std::map<BlockKind, int> kinds;
    for (const ProgramBlock& b : prog.blocks) ++kinds[b.kind];
    EXPECT_EQ(kinds[BlockKind::kF], 4) << "rank " << r;
    EXPECT_EQ(kinds[BlockKind::kI], 4) << "rank " << r;
    EXPECT_EQ(kinds[BlockKind::kW], 4) << "rank " << r;
    EXPECT_EQ(kinds[BlockKind::kB], 0) << "rank " << r;
    const std::string text = listing(l.graph, l.lowered, Rank(r));
    EXPECT_NE(text.find(" I" + std::to_string(r) + ".0"), std::string::npos) << text;
    EXPECT_NE(text.find(" W" + std::to_string(r) + ".0"), std::string::npos) << text;
  }
  EXPECT_TRUE(check_deadlock_free(l.graph, l.lowered).ok());
  auto& blocks0 = l.lowered.programs[0].blocks;
  std::stable_partition(blocks0.begin(), blocks0.end(),
                        [](const ProgramBlock& b) { return b.kind == BlockKind::kW; });
  EXPECT_TRUE(check_deadlock_free(l.graph, l.lowered).ok());
  // Without its I blocks rank 1 never sends the gradients rank 0's I blocks wait for.
  auto& blocks1 = l.lowered.programs[1].blocks;
  blocks1.erase(std::remove_if(blocks1.begin(), blocks1.end(),
                               [](const ProgramBlock& b) { return b.kind == BlockKind::kI; }),
                blocks1.end());
  EXPECT_FALSE(check_deadlock_free(l.graph, l.lowered).ok());
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

// One tag encoding for the runtime's messages and the deadlock check: every part comes back, and
// neighbouring parts never share a tag.
TEST(MessageTag, PartsComeBackAndTagsAreDistinct) {
  std::set<int64_t> seen;
  for (int64_t adapter : {0, 1, 777})
    for (bool forward : {true, false})
      for (int64_t mb : {int64_t{0}, int64_t{1}, kMaxMicroBatches - 1})
        for (int64_t step : {int64_t{0}, kMaxPathSteps - 1}) {
          const int64_t tag = message_tag(adapter, forward, mb, step);
          EXPECT_TRUE(seen.insert(tag).second) << tag;
          const MessageTagParts p = message_tag_parts(tag);
          EXPECT_EQ(p.adapter, adapter);
          EXPECT_EQ(p.forward, forward);
          EXPECT_EQ(p.mb, mb);
          EXPECT_EQ(p.step, step);
        }
}

}  // namespace
}  // namespace loom::lower
