// The static equivalence proof catches planted bugs: each case takes a plan loom made (GPT,
// Llama, a mixture of experts under ep, context parallelism), changes it in one place as a bug
// in the planner, the lowering or a hand edit of plan.json would, and expects the proof to
// refuse it naming the rank, op or tensor. A bug the proof misses is a bug in the proof.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "lower/equivalence.h"
#include "plan/plan.h"

namespace loom::lower {
namespace {

constexpr const char* kGpt =
    "model: {type: gpt, preset: tiny}\nbatch: {global: 8, micro: 2}\n"
    "optimizer: {type: sgd, lr: 0.05}\n";
constexpr const char* kLlama =
    "model: {type: llama, preset: tiny}\nbatch: {global: 8, micro: 2}\n"
    "optimizer: {type: sgd, lr: 0.05}\n";
constexpr const char* kMoe =
    "model: {type: llama, preset: tiny-moe}\nbatch: {global: 8, micro: 2}\n"
    "optimizer: {type: sgd, lr: 0.05}\n";

plan::Plan make(const char* yaml, const std::vector<std::string>& overrides) {
  auto c = parse_config(yaml, "mutation_test.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  auto p = plan::make_plan(*c);
  EXPECT_TRUE(p.ok()) << p.error().message;
  return std::move(p).value();
}

Status prove(const plan::Plan& p) {
  return prove_equivalent(p.model, p.file.graph, p.file.lowered, p.file.micro_batches);
}

// Plants `bug` in a fresh plan of `yaml` + `overrides` and expects the proof to refuse it with
// a message containing every one of `words`. Returns the message.
std::string expect_caught(const char* yaml, const std::vector<std::string>& overrides,
                          const std::function<void(plan::Plan&)>& bug,
                          const std::vector<std::string>& words) {
  plan::Plan p = make(yaml, overrides);
  EXPECT_TRUE(prove(p).ok()) << "the plan before the bug: " << prove(p).error().message;
  bug(p);
  Status s = Status::success();
  EXPECT_NO_THROW(s = prove(p)) << "the checker crashed";
  EXPECT_FALSE(s.ok()) << "the planted bug was not caught";
  if (s.ok()) return "";
  for (const std::string& w : words)
    EXPECT_NE(s.error().message.find(w), std::string::npos)
        << "'" << w << "' missing from: " << s.error().message;
  return s.error().message;
}

graph::Op& op_named(plan::Plan& p, const std::string& name) {
  for (graph::Op& op : p.file.graph.mutable_ops())
    if (op.name() == name) return op;
  ADD_FAILURE() << "no op " << name;
  return p.file.graph.mutable_ops()[0];
}

// The first adapter with a step of `primitive` in its forward (or gradient) path, and the step.
std::pair<Adapter*, CommStep*> step_of(plan::Plan& p, Primitive primitive, bool forward = true) {
  for (Adapter& a : p.file.lowered.adapters)
    for (CommStep& st : (forward ? a.forward : a.backward).steps)
      if (st.primitive == primitive) return {&a, &st};
  ADD_FAILURE() << "no adapter with a " << to_string(primitive) << " step";
  return {nullptr, nullptr};
}

GradSync& sync_of(plan::Plan& p, const std::string& tensor) {
  for (GradSync& s : p.file.lowered.grad_syncs)
    if (p.file.graph.tensor(s.tensor).name == tensor) return s;
  ADD_FAILURE() << "no gradient sync of " << tensor;
  return p.file.lowered.grad_syncs[0];
}

const std::vector<std::string> kTp2 = {"parallel.tp=2"};
const std::vector<std::string> kHybrid = {"parallel.dp=2", "parallel.tp=2", "parallel.pp=2"};
const std::vector<std::string> kSp = {"parallel.tp=2", "parallel.sp=true"};

TEST(Mutation, ShiftedInputRange) {
  expect_caught(kGpt, kTp2,
                [](plan::Plan& p) {
                  graph::Op& op =
                      op_named(p, "h0.mlp.fc2[1/2]");  // reads fc1's output, split on its last dim
                  graph::Range& r = op.inputs[0].ranges.back();
                  r = {r.start - 1, r.end - 1};
                },
                {"rank 1", "h0.mlp.fc2[1/2]", "label"});
}

TEST(Mutation, OverlappingSlices) {
  // Part 1 of a column-parallel linear computes columns 31:63: its weight, bias and output all
  // shifted together, so the op is a consistent op of one device on an overlapping region.
  expect_caught(
      kGpt, kTp2,
      [](plan::Plan& p) {
        graph::Op& op = op_named(p, "h0.mlp.fc1[1/2]");  // weight [n k], output [b s n]
        op.inputs[1].ranges[0] = {op.inputs[1].ranges[0].start - 1, op.inputs[1].ranges[0].end - 1};
        op.outputs[0].ranges.back() = {op.outputs[0].ranges.back().start - 1,
                                       op.outputs[0].ranges.back().end - 1};
      },
      {"h0.mlp.fc1", "overlap"});
}

TEST(Mutation, OutputMarkedPartial) {
  expect_caught(kGpt, kTp2,
                [](plan::Plan& p) {
                  graph::Op& op = op_named(p, "h0.mlp.fc1[0/2]");
                  op.outputs[0].value_chunks = 2;
                },
                {"rank 0", "h0.mlp.fc1[0/2]", "partial sum 0 of 2"});
}

TEST(Mutation, DuplicatedPartialSum) {
  // Both halves of a row-parallel linear claim partial sum 0 of 2: one chunk twice, one never.
  expect_caught(kGpt, kTp2,
                [](plan::Plan& p) { op_named(p, "h0.mlp.fc2[1/2]").outputs[0].value_chunk = 0; },
                {"h0.mlp.fc2", "the same partial sum"});
}

TEST(Mutation, MissingPartialSum) {
  // The all-reduce after a row-parallel linear leaves out one member: that rank's partial sum
  // never enters the others' value.
  expect_caught(kGpt, kTp2,
                [](plan::Plan& p) {
                  auto [a, st] = step_of(p, Primitive::kAllReduce);
                  st->groups[0] = {st->groups[0][0], st->groups[0][0]};
                },
                {"rank 0", "delivers", "counted [0,1/2) 2 time(s), [1/2,1) 0 time(s)"});
}

TEST(Mutation, AllReduceOverTheWrongGroup) {
  // dp2 x tp2: the tensor-parallel all-reduce of replica 0 taken with a rank of replica 1,
  // which holds another part of the batch.
  expect_caught(kGpt, {"parallel.dp=2", "parallel.tp=2"},
                [](plan::Plan& p) {
                  auto [a, st] = step_of(p, Primitive::kAllReduce);
                  std::swap(st->groups[0][1], st->groups[1][1]);
                },
                {"all_reduce over ranks", "unlike boxes"});
}

TEST(Mutation, ReduceScatterForAllGather) {
  expect_caught(kGpt, kSp,
                [](plan::Plan& p) {
                  auto [a, st] = step_of(p, Primitive::kAllGather);
                  st->primitive = Primitive::kReduceScatter;
                  st->to_factor = st->from_factor;
                },
                {"reduce_scatter", "rank"});
}

TEST(Mutation, AllGatherForAllReduce) {
  expect_caught(kGpt, kTp2,
                [](plan::Plan& p) {
                  auto [a, st] = step_of(p, Primitive::kAllReduce);
                  st->primitive = Primitive::kAllGather;
                  st->from_factor = 2;
                },
                {"all_gather", "rank"});
}

TEST(Mutation, AdapterGroupDoubled) {
  expect_caught(kGpt, kHybrid,
                [](plan::Plan& p) {
                  auto [a, st] = step_of(p, Primitive::kAllReduce);
                  std::vector<DeviceId> doubled = st->groups[0];
                  doubled.insert(doubled.end(), st->groups[1].begin(), st->groups[1].end());
                  st->groups[0] = doubled;
                },
                {"all_reduce over ranks", "a group of 4 ranks for a step moving 2"});
}

TEST(Mutation, DroppedGradientSync) {
  expect_caught(kGpt, kHybrid,
                [](plan::Plan& p) {
                  Lowered& l = p.file.lowered;
                  const int64_t gone = &sync_of(p, "h0.ln1.w") - l.grad_syncs.data();
                  for (Program& prog : l.programs) {
                    auto& s = prog.grad_syncs;
                    s.erase(std::remove(s.begin(), s.end(), gone), s.end());
                    for (int64_t& x : s) x -= x > gone;
                  }
                  l.grad_syncs.erase(l.grad_syncs.begin() + gone);
                },
                {"h0.ln1.w", "never summed"});
}

TEST(Mutation, DoubledGradientSync) {
  expect_caught(kGpt, kHybrid,
                [](plan::Plan& p) {
                  Lowered& l = p.file.lowered;
                  l.grad_syncs.push_back(sync_of(p, "h0.ln1.w"));
                  for (DeviceId d : l.grad_syncs.back().devices)
                    l.programs[static_cast<size_t>(d.value())].grad_syncs.push_back(
                        static_cast<int64_t>(l.grad_syncs.size()) - 1);
                },
                {"h0.ln1.w", "summed twice"});
}

TEST(Mutation, GradientSyncMissingARank) {
  expect_caught(kGpt, kHybrid, [](plan::Plan& p) { sync_of(p, "h0.mlp.fc1.w").devices.pop_back(); },
                {"h0.mlp.fc1.w", "missing rank"});
}

TEST(Mutation, GradientSyncCountsARankTwice) {
  expect_caught(kGpt, kHybrid,
                [](plan::Plan& p) {
                  GradSync& s = sync_of(p, "h0.mlp.fc1.w");
                  s.devices.back() = s.devices.front();
                },
                {"h0.mlp.fc1.w", "twice"});
}

TEST(Mutation, ZeroShardGap) {
  // parallel.zero 3: the gather of a parameter takes one shard twice and another never.
  expect_caught(kGpt, {"parallel.dp=2", "parallel.zero=3"},
                [](plan::Plan& p) {
                  // Every gather of 'h0.mlp.fc1.w' stores it as it is read: each rank holds all of
                  // it.
                  for (Adapter& a : p.file.lowered.adapters)
                    if (a.parameter && p.file.graph.tensor(a.tensor).name == "h0.mlp.fc1.w")
                      a.from = a.to;
                },
                {"ZeRO shards of parameter 'h0.mlp.fc1.w'", "overlap"});
}

TEST(Mutation, ZeroGatherMissesAShard) {
  expect_caught(kGpt, {"parallel.dp=2", "parallel.zero=3"},
                [](plan::Plan& p) {
                  for (Adapter& a : p.file.lowered.adapters)
                    if (a.parameter && a.forward.steps.size() == 1 &&
                        a.forward.steps[0].primitive == Primitive::kAllGather) {
                      auto& g = a.forward.steps[0].groups[0];
                      g[1] = g[0];
                      return;
                    }
                },
                {"gather of parameter", "all_gather"});
}

TEST(Mutation, MicroBatchIndexSwapped) {
  expect_caught(kGpt, kHybrid,
                [](plan::Plan& p) {
                  for (ProgramBlock& b : p.file.lowered.programs[0].blocks)
                    if (b.kind == BlockKind::kF && b.micro_batch.value() == 1) {
                      b.micro_batch = MicroBatch(0);
                      return;
                    }
                },
                {"rank 0", "F0.0 twice"});
}

TEST(Mutation, SendToTheWrongRank) {
  expect_caught(kGpt, kHybrid,
                [](plan::Plan& p) {
                  for (Adapter& a : p.file.lowered.adapters)
                    if (a.disjoint)
                      for (CommStep& st : a.forward.steps)
                        if (st.primitive == Primitive::kSendRecv && st.groups.size() > 1) {
                          st.groups[0][1] = st.groups[1][1];
                          return;
                        }
                },
                {"send_recv", "receives two pieces"});
}

TEST(Mutation, RecomputationRepeatsAPipelineTransfer) {
  // A recomputed region stretched over the stage's last items: its backward would run the
  // send to the next stage again.
  expect_caught(kGpt, {"parallel.pp=2", "parallel.recompute=full"},
                [](plan::Plan& p) {
                  Segment& seg = p.file.lowered.programs[0].segments[0];
                  ASSERT_FALSE(seg.recompute.empty());
                  seg.recompute.back().end = static_cast<int64_t>(seg.items.size());
                },
                {"rank 0", "recomputes", "a transfer between stages"});
}

TEST(Mutation, RecomputedRegionsOverlap) {
  expect_caught(kGpt, {"parallel.recompute=full"},
                [](plan::Plan& p) {
                  Segment& seg = p.file.lowered.programs[0].segments[0];
                  ASSERT_GE(seg.recompute.size(), 2u);
                  seg.recompute[1].begin = seg.recompute[0].end - 1;
                },
                {"rank 0", "recomputes items"});
}

TEST(Mutation, RecomputationOverTheLoss) {
  expect_caught(kGpt, {"parallel.recompute=full"},
                [](plan::Plan& p) {
                  Segment& seg = p.file.lowered.programs[0].segments[0];
                  ASSERT_FALSE(seg.recompute.empty());
                  seg.recompute.back().end = static_cast<int64_t>(seg.items.size());
                },
                {"rank 0", "which makes the loss"});
}

TEST(Mutation, LossScaledTwice) {
  expect_caught(kGpt, kHybrid,
                [](plan::Plan& p) {
                  for (Program& prog : p.file.lowered.programs)
                    if (prog.loss_seed > 0) {
                      prog.loss_seed *= 2;
                      return;
                    }
                },
                {"seeds the loss"});
}

TEST(Mutation, OpOnTheWrongRank) {
  expect_caught(kGpt, kHybrid,
                [](plan::Plan& p) { op_named(p, "h0.mlp.fc1[0/2][0/2]").device = DeviceId(1); },
                {"rank", "h0.mlp"});
}

TEST(Mutation, OpMovedToAnotherRanksProgram) {
  expect_caught(kGpt, kTp2,
                [](plan::Plan& p) {
                  auto& from = p.file.lowered.programs[0].segments[0].items;
                  ASSERT_EQ(from.back().kind, SegmentItem::Kind::kOp);
                  const SegmentItem moved = from.back();
                  from.pop_back();
                  p.file.lowered.programs[1].segments[0].items.push_back(moved);
                },
                {"rank 1", "runs op", "which the plan places on rank 0"});
}

TEST(Mutation, ProgramItemsOutOfOrder) {
  expect_caught(kGpt, kTp2,
                [](plan::Plan& p) {
                  auto& items = p.file.lowered.programs[0].segments[0].items;
                  // The first adapter and the op after it: the op then reads before the adapter
                  // delivers.
                  for (size_t i = 0; i + 1 < items.size(); ++i)
                    if (items[i].kind == SegmentItem::Kind::kAdapter &&
                        items[i + 1].kind == SegmentItem::Kind::kOp) {
                      std::swap(items[i], items[i + 1]);
                      return;
                    }
                },
                {"rank 0", "before", "delivers it"});
}

TEST(Mutation, BackwardBlockDropped) {
  expect_caught(
      kGpt, kHybrid,
      [](plan::Plan& p) {
        auto& blocks = p.file.lowered.programs[3].blocks;
        blocks.erase(std::find_if(blocks.begin(), blocks.end(),
                                  [](const ProgramBlock& b) { return b.kind == BlockKind::kB; }));
      },
      {"rank 3", "backward"});
}

TEST(Mutation, OpInTheWrongStage) {
  expect_caught(kGpt, kHybrid,
                [](plan::Plan& p) {
                  for (graph::Op& op : p.file.graph.mutable_ops())
                    if (op.stage.value() == 1) {
                      op.stage = StageId(0);
                      return;
                    }
                },
                {"stage"});
}

TEST(Mutation, ExpertAllToAllAlongTheWrongDimension) {
  expect_caught(kMoe, {"parallel.dp=2", "parallel.ep=2"},
                [](plan::Plan& p) {
                  auto [a, st] = step_of(p, Primitive::kAllToAll);
                  std::swap(st->from_factor, st->to_factor);
                },
                {"all_to_all", "rank"});
}

TEST(Mutation, ExpertOpReadsAnotherExpertsWeights) {
  expect_caught(kMoe, {"parallel.dp=2", "parallel.ep=2"},
                [](plan::Plan& p) {
                  for (graph::Op& op : p.file.graph.mutable_ops())
                    if (op.type() == "expert_linear" && op.device.value() == 1) {
                      graph::Range& e =
                          op.inputs[1].ranges[0];  // the expert dimension of the weight
                      const int64_t n = e.size();
                      e = {e.start - n, e.end - n};
                      return;
                    }
                  ADD_FAILURE() << "no expert_linear on rank 1";
                },
                {"rank 1", "expert_linear"});
}

TEST(Mutation, RingStepReadsTheWrongKeyChunk) {
  expect_caught(
      kLlama, {"parallel.cp=2"},
      [](plan::Plan& p) {
        for (graph::Op& op : p.file.graph.mutable_ops())
          if (op.type() == "ring_attention_step" && op.attrs().get<int64_t>("cp_step") == 1) {
            for (size_t i : {1, 2}) {
              graph::Range& t = op.inputs[i].ranges[1];
              const int64_t n = t.size();
              t = t.start == 0 ? graph::Range{n, 2 * n} : graph::Range{0, n};
            }
            return;
          }
        ADD_FAILURE() << "no ring step 1";
      },
      {"ring attention step 1 of 2", "attends to key chunk"});
}

TEST(Mutation, ReadsAnotherTensor) {
  expect_caught(kLlama, kTp2,
                [](plan::Plan& p) {
                  graph::Op& op = op_named(p, "h1.attn.q[0/2]");
                  const graph::Op& other = op_named(p, "h0.attn.q[0/2]");
                  op.inputs[0].tensor = other.inputs[0].tensor;
                },
                {"h1.attn.q[0/2]", "where one device's op reads"});
}

// Random single-field damage of every kind of plan field: the checker answers (proven or not),
// never crashes. Seeded: a failure names its seed.
TEST(Mutation, RandomDamageNeverCrashesTheChecker) {
  const plan::Plan base = make(kGpt, {"parallel.tp=2", "parallel.pp=2", "parallel.zero=3"});
  std::mt19937_64 rng(46);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % std::max<size_t>(n, 1)); };
  auto nudge = [&](int64_t& x) {
    const int64_t by = static_cast<int64_t>(pick(4)) - 2;  // -2, -1, 1, 2: never nothing
    x += by >= 0 ? by + 1 : by;
  };
  int caught = 0;
  for (int trial = 0; trial < 300; ++trial) {
    plan::Plan p = base;
    auto& ops = p.file.graph.mutable_ops();
    Lowered& l = p.file.lowered;
    graph::Op& op = ops[pick(ops.size())];
    Adapter& a = l.adapters[pick(l.adapters.size())];
    Program& prog = l.programs[pick(l.programs.size())];
    switch (trial % 10) {
      case 0: {
        auto& pieces = pick(2) ? op.inputs : op.outputs;
        graph::SubTensor& s = pieces[pick(pieces.size())];
        if (!s.ranges.empty())
          nudge(pick(2) ? s.ranges[pick(s.ranges.size())].start
                        : s.ranges[pick(s.ranges.size())].end);
        break;
      }
      case 1:
        nudge(op.outputs[0].value_chunk);
        nudge(op.outputs[0].value_chunks);
        break;
      case 2: {
        int64_t d = op.device.value();
        nudge(d);
        op.device = DeviceId(d);
        break;
      }
      case 3: {
        CommPath& path = pick(2) ? a.forward : a.backward;
        if (path.steps.empty()) break;
        CommStep& st = path.steps[pick(path.steps.size())];
        nudge(st.k);
        if (pick(2)) st.from_factor += static_cast<int>(pick(3)) - 1;
        if (pick(2)) st.to_factor += static_cast<int>(pick(3)) - 1;
        break;
      }
      case 4: {
        CommPath& path = pick(2) ? a.forward : a.backward;
        if (path.steps.empty()) break;
        CommStep& st = path.steps[pick(path.steps.size())];
        if (st.groups.empty()) break;
        auto& g = st.groups[pick(st.groups.size())];
        int64_t d = g[pick(g.size())].value();
        nudge(d);
        g[pick(g.size())] = DeviceId(d);
        break;
      }
      case 5: {
        Layout& lay = pick(2) ? a.from : a.to;
        nudge(pick(2) ? lay.r : lay.v);
        break;
      }
      case 6:
        if (!prog.segments.empty()) {
          auto& items = prog.segments[pick(prog.segments.size())].items;
          if (!items.empty()) nudge(items[pick(items.size())].index);
        }
        break;
      case 7:
        if (!prog.blocks.empty()) {
          ProgramBlock& b = prog.blocks[pick(prog.blocks.size())];
          const bool stage = pick(2);
          int64_t x = stage ? b.stage.value() : b.micro_batch.value();
          nudge(x);
          if (stage)
            b.stage = StageId(x);
          else
            b.micro_batch = MicroBatch(x);
        }
        break;
      case 8:
        if (!l.grad_syncs.empty()) {
          GradSync& g = l.grad_syncs[pick(l.grad_syncs.size())];
          if (!g.devices.empty()) {
            int64_t d = g.devices[0].value();
            nudge(d);
            g.devices[pick(g.devices.size())] = DeviceId(d);
          }
        }
        break;
      case 9:
        if (!prog.grad_syncs.empty()) nudge(prog.grad_syncs[pick(prog.grad_syncs.size())]);
        break;
    }
    Status s = Status::success();
    EXPECT_NO_THROW(s = prove(p)) << "trial " << trial;
    caught += !s.ok();
  }
  // Damage that changes nothing the runtime reads (a send/recv step's factor, a member set to
  // the device it already was) is rightly proven; nearly all else is caught.
  EXPECT_GT(caught, 270);
}

}  // namespace
}  // namespace loom::lower
