// parallel.zero 3 (lower/param_shards.h, runtime/param_gather.cc): each parameter is
// stored split over the ranks reading it and gathered before each use by an adapter from the
// path search; its gradient path reduce-scatters onto the shard. Training equals one device with
// dp, dp x tp and dp x pp (and with recomputation), every element is stored by one rank, and
// checkpoints move between zero 3 and zero 0.
#include <filesystem>
#include <map>

#include "launch/planned_trainer.h"
#include "plan/plan.h"
#include "tests/runtime/checkpoint_moves.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

Config config(const std::vector<std::string>& overrides) {
  const char* yaml = R"(run: {seed: 3, steps: 6}
model: {type: gpt, preset: tiny}
batch: {global: 8, micro: 2}
optimizer: {type: adamw, lr: 0.002, weight_decay: 0.1, clip_grad_norm: 1.0}
comm: {timeout_s: 60}
)";
  auto c = parse_config(yaml, "zero3.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

const testing_support::Reference& reference(const std::vector<std::string>& extra) {
  static std::map<std::vector<std::string>, testing_support::Reference> cache;
  auto it = cache.find(extra);
  if (it == cache.end())
    it = cache.emplace(extra, testing_support::train_single_device(config(extra), 5)).first;
  return it->second;
}

// Elements each tensor's stored pieces hold, summed over the ranks of a `world_size` run.
std::map<std::string, int64_t> stored_elements(const Config& c, int world_size) {
  comm::LocalWorld world(world_size, 60);
  std::vector<std::map<std::string, int64_t>> per_rank(static_cast<size_t>(world_size));
  auto statuses = world.run([&](comm::Comm& comm) -> Status {
    at::set_num_threads(1);
    LOOM_ASSIGN_OR_RETURN(auto trainer, launch::create_trainer(c, comm.shared_from_this()));
    const auto& exec = trainer->executor();
    auto& mine = per_rank[static_cast<size_t>(comm.world_rank().value())];
    for (size_t i = 0; i < exec.parameters().size(); ++i)
      mine[trainer->graph().tensor(exec.parameter_pieces()[i].tensor).name] +=
          exec.parameters()[i].numel();
    return Status::success();
  });
  std::map<std::string, int64_t> out;
  for (int r = 0; r < world_size; ++r) {
    EXPECT_TRUE(statuses[r].ok()) << statuses[r].error().message;
    for (const auto& [name, n] : per_rank[static_cast<size_t>(r)]) out[name] += n;
  }
  return out;
}

// Equal to one device; and each parameter is stored once over all ranks, but those read in
// several pipeline stages (`replicated`: the tied embedding and LM head), which keep a gradient
// sync and are stored by each of their `copies` readers.
void expect_zero3(std::vector<std::string> overrides, int world_size,
                  const std::vector<std::string>& extra = {},
                  const std::vector<std::string>& replicated = {}, int64_t copies = 1) {
  overrides.push_back("parallel.zero=3");
  std::vector<std::string> all = overrides;
  all.insert(all.end(), extra.begin(), extra.end());
  testing_support::expect_equal_to_single_device(reference(extra), config(all), world_size,
                                                 {"attn.k.b"});
  const auto one = stored_elements(config(extra), 1);
  const auto split = stored_elements(config(all), world_size);
  ASSERT_EQ(one.size(), split.size());
  for (const auto& [name, n] : one) {
    const bool kept = std::find(replicated.begin(), replicated.end(), name) != replicated.end();
    EXPECT_EQ(split.at(name), kept ? n * copies : n) << name;
  }
}

TEST(Zero3, Dp2AdamW) { expect_zero3({"parallel.dp=2"}, 2); }
TEST(Zero3, Dp2Tp2AdamW) { expect_zero3({"parallel.dp=2", "parallel.tp=2"}, 4); }
TEST(Zero3, Dp2Tp2SequenceParallel) {
  expect_zero3({"parallel.dp=2", "parallel.tp=2", "parallel.sp=true"}, 4);
}
// The tied embedding is read by stage 0 and the LM head by stage 1: it stays replicated on the
// four ranks reading it, with its gradient all-reduced; every other parameter is split over its
// stage's two replicas.
TEST(Zero3, Dp2Pp2AdamW) { expect_zero3({"parallel.dp=2", "parallel.pp=2"}, 4, {}, {"wte"}, 4); }
TEST(Zero3, Dp2FullRecompute) { expect_zero3({"parallel.dp=2", "parallel.recompute=full"}, 2); }
TEST(Zero3, Dp2Sgd) {
  expect_zero3({"parallel.dp=2"}, 2,
               {"optimizer.type=sgd", "optimizer.lr=0.3", "optimizer.momentum=0.9"});
}

// The plan: a sharded parameter has no gradient sync, its adapter gathers it (a linear's weight
// again in its backward) and reduce-scatters its gradient.
TEST(Zero3, PlanGathersEachParameterBeforeItsUse) {
  auto plan = plan::make_plan(config({"parallel.dp=2", "parallel.zero=3"}));
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  const lower::Lowered& l = plan->file.lowered;
  EXPECT_TRUE(l.grad_syncs.empty());
  int64_t parameter_adapters = 0, regathered = 0;
  for (const lower::Adapter& a : l.adapters) {
    if (!a.parameter) continue;
    ++parameter_adapters;
    regathered += a.regather;
    ASSERT_EQ(a.forward.steps.size(), 1u) << a.forward.to_string();
    EXPECT_EQ(a.forward.steps[0].primitive, lower::Primitive::kAllGather);
    ASSERT_EQ(a.backward.steps.size(), 1u) << a.backward.to_string();
    EXPECT_EQ(a.backward.steps[0].primitive, lower::Primitive::kReduceScatter);
    EXPECT_EQ(a.from.r, 1) << a.from.to_string();
    EXPECT_EQ(a.to.r, 2) << a.to.to_string();
  }
  // GPT tiny: 2 layers x (2 norms x 2 + 6 linears x 2 ... ) -- every parameter read is one.
  int64_t reads = 0;
  for (const graph::Op& op : plan->file.graph.ops())
    for (const auto& in : op.inputs)
      reads += plan->file.graph.tensor(in.tensor).role == graph::TensorRole::kParameter;
  EXPECT_EQ(parameter_adapters * 2, reads);  // one adapter per reading op, two replicas each
  EXPECT_EQ(regathered, 2 * 6 + 1);          // six linears a layer and the LM head
}

// One step of dp2 (2 micro-batches per rank): every read of a parameter is one gather in the
// forward and a linear's weight one more in the backward; all but a segment's first gather of a
// forward, and most of a backward's (autograd reaches q, k and v in its own order), were started
// while the rank computed.
TEST(Zero3, GathersRunAheadOfTheirUse) {
  const Config c = config({"parallel.dp=2", "parallel.zero=3"});
  auto plan = plan::make_plan(c);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  int64_t reads = 0, weights = 0;
  for (const lower::Adapter& a : plan->file.lowered.adapters) {
    reads += a.parameter;
    weights += a.regather;
  }
  const int64_t micro_batches = c.micro_batches();
  ASSERT_EQ(micro_batches, 2);
  comm::LocalWorld world(2, 60);
  std::vector<runtime::Executor::GatherCounts> counts(2);
  auto statuses = world.run([&](comm::Comm& comm) -> Status {
    at::set_num_threads(1);
    LOOM_ASSIGN_OR_RETURN(auto trainer, launch::create_trainer(c, comm.shared_from_this()));
    LOOM_ASSIGN_OR_RETURN(auto stats, trainer->step());
    (void)stats;
    counts[static_cast<size_t>(comm.world_rank().value())] = trainer->executor().gather_counts();
    return Status::success();
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r].error().message;
    EXPECT_EQ(counts[r].gathers, micro_batches * (reads + weights)) << "rank " << r;
    EXPECT_GE(counts[r].ahead, micro_batches * (reads - 1)) << "rank " << r;
    EXPECT_GE(counts[r].ahead, micro_batches * (reads - 1 + weights / 2)) << "rank " << r;
  }
}

TEST(Zero3, RefusesSplitBackwardSchedules) {
  auto plan = plan::make_plan(
      config({"parallel.pp=2", "parallel.dp=2", "parallel.zero=3", "parallel.schedule=zb-h1"}));
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().message.find("parallel.zero"), std::string::npos) << plan.error().message;
}

// A zero-3 checkpoint holds each parameter and its optimizer state once, as the shards'
// slices: read whole it is one device's state, and checkpoints move both ways.
TEST(Zero3, CheckpointsMoveBetweenZero3AndZero0) {
  testing_support::expect_checkpoints_move(config, {"parallel.dp=2", "parallel.zero=3"}, 2,
                                           "zero3");
}

}  // namespace
}  // namespace loom
