// make_plan without LibTorch: a GPT tiny plan over dp2 x tp2 x pp2, its estimate on the cost
// model, its errors, and plan.json for the runtime (LOOM_PLAN_OUT=DIR writes DIR/plan.json and
// DIR/config.yaml; tests/runtime/plan_file_run_test.cc runs them).
#include "plan/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "lower/fusion.h"
#include "models/model.h"
#include "plan/estimate.h"
#include "scheduler/csv.h"
#include "scheduler/repetend.h"
#include "scheduler/simulator.h"
#include "tests/support/plan_chain.h"

namespace loom::plan {
namespace {

constexpr const char* kYaml =
    "model: {type: gpt, preset: tiny}\n"
    "parallel: {dp: 2, tp: 2, pp: 2}\n"
    "batch: {global: 8, micro: 2}\n"
    "optimizer: {type: sgd, lr: 0.05, momentum: 0.9}\n";

Config config(const std::vector<std::string>& overrides = {}) {
  auto c = parse_config(kYaml, "plan_test.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

// The executor runs a linear and the bias_add that alone reads it as one at::linear, and the
// estimate counts no output for it: column-parallel pieces fuse; a row-parallel linear, whose
// output is a partial sum the bias_add may only read after its all-reduce, does not.
TEST(Fusion, ColumnParallelLinearsFuseRowParallelOnesDoNot) {
  auto plan = make_plan(config({"parallel.dp=1", "parallel.pp=1"}));  // tp 2
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  const graph::Graph& g = plan->file.graph;
  const std::vector<bool> fused = lower::fused_into_next(g, plan->file.lowered);
  ASSERT_EQ(fused.size(), g.ops().size());
  int64_t linears = 0, column = 0, row = 0;
  for (size_t i = 0; i < g.ops().size(); ++i) {
    const graph::Op& op = g.ops()[i];
    if (op.type() != "linear") {
      EXPECT_FALSE(fused[i]) << op.name();
      continue;
    }
    ++linears;
    if (op.outputs[0].is_partial()) {
      ++row;
      EXPECT_FALSE(fused[i]) << op.name() << " writes a partial sum";
    } else if (fused[i]) {
      ++column;
    }
  }
  // In each rank's program, a fused linear is followed by the bias_add that reads its output.
  for (const auto& prog : plan->file.lowered.programs)
    for (const auto& seg : prog.segments)
      for (size_t k = 0; k < seg.items.size(); ++k) {
        const auto& item = seg.items[k];
        if (item.kind != lower::SegmentItem::Kind::kOp || !fused[static_cast<size_t>(item.index)])
          continue;
        ASSERT_LT(k + 1, seg.items.size());
        const graph::Op& lin = g.ops()[static_cast<size_t>(item.index)];
        const graph::Op& bias = g.ops()[static_cast<size_t>(seg.items[k + 1].index)];
        EXPECT_EQ(bias.type(), "bias_add") << lin.name();
        EXPECT_EQ(bias.device, lin.device) << lin.name();
        EXPECT_TRUE(bias.inputs[0] == lin.outputs[0]) << lin.name();
      }
  EXPECT_GT(row, 0);     // attention out and mlp fc2 on each tp rank
  EXPECT_GT(column, 0);  // q/k/v and mlp fc1 pieces
  EXPECT_LT(column + row, linears + 1);

  // Without fusion the estimate would count each fused linear's output once more.
  auto single = make_plan(config({"parallel.dp=1", "parallel.tp=1", "parallel.pp=1"}));
  ASSERT_TRUE(single.ok()) << single.error().message;
  const std::vector<bool> one = lower::fused_into_next(single->file.graph, single->file.lowered);
  EXPECT_GT(std::count(one.begin(), one.end(), true), 0);
}

// What fuses follows the op's trait (graph::OpDef::weight_product), not its type's name: the
// linears renamed keep their fusion, and with the trait taken off nothing fuses.
TEST(Fusion, FollowsTheWeightProductTraitNotTheTypeName) {
  auto plan = make_plan(config({"parallel.dp=1", "parallel.tp=1", "parallel.pp=1"}));
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  const lower::Lowered& lowered = plan->file.lowered;
  const std::vector<bool> as_made = lower::fused_into_next(plan->file.graph, lowered);
  ASSERT_GT(std::count(as_made.begin(), as_made.end(), true), 0);
  auto with_defs = [&](bool rename, bool weight_product) {
    graph::Graph g = plan->file.graph;
    for (graph::Op& op : g.mutable_ops()) {
      if (!op.def->weight_product) continue;
      auto def = std::make_shared<graph::OpDef>(*op.def);
      if (rename) def->type = "user_projection";
      def->weight_product = weight_product;
      op.def = std::move(def);
    }
    return lower::fused_into_next(g, lowered);
  };
  EXPECT_EQ(with_defs(/*rename=*/true, /*weight_product=*/true), as_made);
  const std::vector<bool> none = with_defs(/*rename=*/false, /*weight_product=*/false);
  EXPECT_EQ(std::count(none.begin(), none.end(), true), 0);
}

TEST(MakePlan, PlansLowersAndEstimatesWithoutLibTorch) {
  auto plan = make_plan(config());
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_EQ(plan->world_size(), 8);
  EXPECT_EQ(plan->file.lowered.programs.size(), 8u);
  EXPECT_EQ(plan->file.micro_batches, 2);
  EXPECT_FALSE(plan->file.hash.empty());
  EXPECT_FALSE(plan->schedule.csv.empty());  // pipelined: the schedule as torch's CSV
  EXPECT_EQ(plan->file.schedule_csv, plan->schedule.csv);
  ASSERT_EQ(plan->estimate.ranks.size(), 8u);
  double params = 0;
  for (const auto& r : plan->estimate.ranks) {
    EXPECT_GT(r.peak_bytes, r.param_bytes);
    EXPECT_GT(r.compute_s, 0);
    params += r.parameters;
  }
  // Every parameter element is held by each of the dp (2) replicas, some by more ranks (norms
  // replicated over tp, the tied embedding on the first and the last stage); no rank holds all.
  int64_t model_params = 0;
  for (const auto& t : plan->model.tensors())
    if (t.role == graph::TensorRole::kParameter) model_params += numel(t.shape);
  EXPECT_GE(params, 2.0 * static_cast<double>(model_params));
  for (const auto& r : plan->estimate.ranks)
    EXPECT_LT(r.parameters, static_cast<double>(model_params));
  // plan.json round-trips.
  auto json = lower::plan_to_json(plan->file);
  ASSERT_TRUE(json.ok());
  auto back = lower::plan_from_json(*json, "plan.json");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->hash, plan->file.hash);

  if (const char* out = std::getenv("LOOM_PLAN_OUT")) {
    std::filesystem::create_directories(out);
    std::ofstream(std::filesystem::path(out) / "plan.json") << *json;
    std::ofstream(std::filesystem::path(out) / "config.yaml") << kYaml;
  }
}

// parallel.recompute=full marks one region per model layer on every rank (GPT tiny: 2), each
// holding that layer's ops and the tensor-parallel all-reduces between them; selective marks
// each attention core alone.
TEST(Recompute, FullMarksEachLayerSelectiveEachAttentionCore) {
  for (const std::string mode : {"full", "selective"}) {
    auto plan = make_plan(config({"parallel.dp=1", "parallel.pp=1", "parallel.recompute=" + mode}));
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    const graph::Graph& g = plan->file.graph;
    for (const lower::Program& prog : plan->file.lowered.programs) {
      ASSERT_EQ(prog.segments.size(), 1u);
      const lower::Segment& seg = prog.segments[0];
      ASSERT_EQ(seg.recompute.size(), 2u) << mode;
      std::set<int64_t> layers;
      for (const lower::RecomputeRegion& r : seg.recompute) {
        int64_t adapters = 0;
        std::set<int64_t> region_layers;
        for (int64_t i = r.begin; i < r.end; ++i) {
          const lower::SegmentItem& it = seg.items[static_cast<size_t>(i)];
          if (it.kind == lower::SegmentItem::Kind::kAdapter) {
            ++adapters;
            continue;
          }
          const graph::Op& op = g.ops()[static_cast<size_t>(it.index)];
          region_layers.insert(op.layer());
          if (mode == "selective") {
            EXPECT_EQ(op.type(), "attention");
          }
        }
        ASSERT_EQ(region_layers.size(), 1u);
        EXPECT_TRUE(layers.insert(*region_layers.begin()).second);
        if (mode == "full") {
          EXPECT_GE(adapters, 2) << "the attention and MLP all-reduces";
        } else {
          EXPECT_EQ(r.end - r.begin, 1);
        }
      }
    }
    const std::string listing = lower::listing(g, plan->file.lowered, Rank(0));
    EXPECT_NE(listing.find("recompute in backward"), std::string::npos) << listing;
  }
}

// The estimate keeps less and computes more the more is recomputed: full keeps only the layers'
// inputs (and the embedding, head and loss), selective drops attention's probabilities; the
// recomputed forward lengthens the backward (pipeline blocks included).
TEST(Recompute, TheEstimateKeepsLessAndComputesMore) {
  std::map<std::string, Estimate> e;
  std::map<std::string, double> makespan;
  for (const std::string mode : {"none", "selective", "full"}) {
    auto plan = make_plan(config(
        {"parallel.dp=1", "parallel.tp=1", "model.args.layers=4", "parallel.recompute=" + mode}));
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    e[mode] = plan->estimate;
    makespan[mode] = plan->pipeline.makespan_s;
  }
  for (size_t r = 0; r < 2; ++r) {
    const double none = e["none"].ranks[r].activation_bytes;
    EXPECT_LT(e["selective"].ranks[r].activation_bytes, none) << r;
    EXPECT_LT(e["full"].ranks[r].activation_bytes, e["selective"].ranks[r].activation_bytes) << r;
    EXPECT_GT(e["selective"].ranks[r].compute_s, e["none"].ranks[r].compute_s) << r;
    EXPECT_GT(e["full"].ranks[r].compute_s, e["selective"].ranks[r].compute_s) << r;
  }
  // Full recompute runs every layer's forward again: the makespan grows, but by less than a
  // third (a backward is twice a forward; the head is not recomputed).
  EXPECT_GT(makespan["full"], makespan["none"]);
  EXPECT_LT(makespan["full"], makespan["none"] * 4 / 3);
}

// run.precision=bf16: activations are bf16 in the planned graph, so what crosses ranks is half
// the bytes: pp2's activation sends exactly half. Master weights and their gradients stay
// float32: parameter bytes and the tied embedding's gradient all-reduce do not change. Saved
// activations fall to 0.6 (attention's float32 softmax statistics and the loss stay float32).
// On GPUs, where attention runs the same fused kernel in both precisions (on the CPU bf16 keeps
// the explicit products: graph::fused_attention).
TEST(MakePlan, Bf16HalvesTheActivationBytesSent) {
  const std::vector<std::string> pp2 = {"parallel.dp=1", "parallel.tp=1", "parallel.pp=2",
                                        "run.device=cuda"};
  auto fp32 = make_plan(config(pp2));
  std::vector<std::string> bf16_overrides = pp2;
  bf16_overrides.push_back("run.precision=bf16");
  auto bf16 = make_plan(config(bf16_overrides));
  ASSERT_TRUE(fp32.ok() && bf16.ok());
  for (size_t r = 0; r < fp32->estimate.ranks.size(); ++r) {
    const RankEstimate &a = fp32->estimate.ranks[r], &b = bf16->estimate.ranks[r];
    ASSERT_GT(a.sent.at("send_recv"), 0);
    EXPECT_EQ(b.sent.at("send_recv"), 0.5 * a.sent.at("send_recv")) << "rank " << r;
    EXPECT_EQ(b.sent.at("grad all_reduce"), a.sent.at("grad all_reduce")) << "rank " << r;
    EXPECT_EQ(b.param_bytes, a.param_bytes) << "rank " << r;
    EXPECT_LE(b.activation_bytes, 0.61 * a.activation_bytes) << "rank " << r;
  }
  EXPECT_NE(bf16->file.hash, fp32->file.hash);
}

// The estimate follows the cost model: an H100 computes 4x faster than the A100 preset, and the
// cost model names itself in the plan.
TEST(MakePlan, TheEstimateFollowsTheCostModel) {
  auto a100 = make_plan(config());
  auto h100 = make_plan(config({"cost.preset=h100"}));
  ASSERT_TRUE(a100.ok() && h100.ok());
  EXPECT_NE(h100->cost.name.find("h100"), std::string::npos);
  const double a = a100->estimate.ranks[0].compute_s, h = h100->estimate.ranks[0].compute_s;
  EXPECT_NEAR(a / h, 4.0, 1e-9);  // both presets' FLOP rates, 400e12 / 100e12
  EXPECT_EQ(a100->estimate.max_peak_bytes(),
            h100->estimate.max_peak_bytes());  // memory is the model's
  // A cost-model key changes the plan's hash (it shapes the communication paths).
  EXPECT_NE(a100->file.hash, h100->file.hash);
}

// Four ranks on two devices' worth of compute: the three light ones share it with the heavy one
// (each at half speed) until they finish; the heavy one then runs alone at full speed.
TEST(SharedCompute, FillsTheNodeAsTheLightRanksFinish) {
  CostModel cost;
  cost.device_flops_per_s = 1e9;
  cost.devices_per_node = 4;
  cost.node_flops_per_s = 2e9;
  EXPECT_DOUBLE_EQ(shared_compute_seconds({1, 2, 1, 1}, cost), 3.0);  // 1 s at half, then 1 s
  EXPECT_DOUBLE_EQ(shared_compute_seconds({1, 1, 1, 1}, cost), 2.0);  // all at half speed
  cost.node_flops_per_s = 0;                                          // nothing shared
  EXPECT_DOUBLE_EQ(shared_compute_seconds({1, 2, 1, 1}, cost), 2.0);
}

// Ranks that share a node's compute (CPU ranks on fewer cores than ranks): all busy at once they
// split the node's rate; a pipeline's ranks idle in its bubble leave theirs to the busy ones.
TEST(MakePlan, RanksSharingANodeSplitItsRate) {
  const std::vector<std::string> dp4 = {"parallel.dp=4", "parallel.tp=1", "parallel.pp=1",
                                        "cost.preset=cpu", "cost.devices_per_node=4"};
  auto alone = make_plan(config(dp4));
  std::vector<std::string> shared = dp4;
  shared.push_back("cost.node_flops_per_s=60e9");  // two of the cpu preset's 30 GFLOP/s ranks
  auto halved = make_plan(config(shared));
  ASSERT_TRUE(alone.ok() && halved.ok());
  // Four equally busy ranks on two devices' worth of compute: each computes half as fast.
  EXPECT_NEAR(halved->estimate.ranks[0].compute_s / alone->estimate.ranks[0].compute_s, 2.0, 1e-9);

  const std::vector<std::string> pp4 = {
      "parallel.dp=1",       "parallel.tp=1",   "parallel.pp=4",          "batch.micro=4",
      "model.args.layers=4", "cost.preset=cpu", "cost.devices_per_node=4"};
  auto bubble = make_plan(config(pp4));
  shared = pp4;
  shared.push_back("cost.node_flops_per_s=60e9");
  auto bubble_shared = make_plan(config(shared));
  ASSERT_TRUE(bubble.ok() && bubble_shared.ok());
  // Two micro-batches over four stages: the makespan is more than twice any stage's busy time,
  // so the node's share (the four stages' work over two devices' rate) does not bind.
  ASSERT_GT(bubble->estimate.bubble_ratio, 0.5);
  EXPECT_NEAR(bubble_shared->estimate.ranks[0].compute_s, bubble->estimate.ranks[0].compute_s,
              1e-12);
  // Without sharing, a node's rate is its devices' sum whatever node_flops_per_s says above it.
  shared = dp4;
  shared.push_back("cost.node_flops_per_s=1e15");
  auto generous = make_plan(config(shared));
  ASSERT_TRUE(generous.ok());
  EXPECT_EQ(generous->estimate.ranks[0].compute_s, alone->estimate.ranks[0].compute_s);
}

TEST(MakePlan, UserMistakesNameTheKey) {
  auto plan = make_plan(config({"parallel.tp=3", "parallel.dp=1", "parallel.pp=1"}));
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().message.find("parallel.tp"), std::string::npos) << plan.error().message;
  // More micro-batches per step than message tags can tell apart.
  auto many = make_plan(config(
      {"batch.global=4100", "batch.micro=1", "parallel.dp=2", "parallel.pp=1", "parallel.tp=1"}));
  ASSERT_FALSE(many.ok());
  EXPECT_NE(many.error().message.find("batch.global"), std::string::npos) << many.error().message;
  EXPECT_NE(many.error().message.find("2050 micro-batches"), std::string::npos)
      << many.error().message;
  auto preset = make_plan(config({"cost.preset=tpu"}));
  ASSERT_FALSE(preset.ok());
  EXPECT_NE(preset.error().message.find("cost.preset"), std::string::npos)
      << preset.error().message;
}

// A user's model builder (the embedding API's) is planned like a zoo model: its model.type
// need not be one of the zoo's.
TEST(MakePlan, AUserModelIsPlannedLikeAZooModel) {
  Registries registries;
  int built = 0;
  registries.model = [&built](const Config& c, const models::GraphShape& shape,
                              const graph::OpRegistry& ops) {
    ++built;
    EXPECT_EQ(shape.samples, 2 * 2);  // batch.micro 2 x parallel.dp 2
    EXPECT_EQ(shape.tp, 2);
    Config gpt = c;
    gpt.model.type = "gpt";
    return testing_support::single_device_graph(gpt, ops);
  };
  auto plan = make_plan(config({"model.type=my-lm"}), registries);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_EQ(built, 1);
  EXPECT_EQ(plan->file.lowered.programs.size(), 8u);
}

// parallel.schedule search on GPT tiny with 6 layers over 4 stages: the stages differ (the
// embedding on the first, the LM head on the last, and layers split 2-2-1-1 or so), and the
// searched schedule runs each stage's blocks at the cost model's figures for that stage.
Config search_config(const std::vector<std::string>& more = {}) {
  std::vector<std::string> overrides = {
      "parallel.dp=1",       "parallel.tp=1",  "parallel.pp=4", "parallel.schedule=search",
      "model.args.layers=6", "batch.global=8", "batch.micro=1"};
  overrides.insert(overrides.end(), more.begin(), more.end());
  return config(overrides);
}

TEST(SearchedSchedule, RunsEachStageAtItsCostModelDuration) {
  const Config c = search_config();
  auto plan = make_plan(c);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  const std::vector<double> fwd = forward_seconds(plan->file.graph, 4, plan->cost);
  ASSERT_EQ(fwd.size(), 4u);
  EXPECT_NE(*std::min_element(fwd.begin(), fwd.end()), *std::max_element(fwd.begin(), fwd.end()))
      << "the stages should differ for this test to mean something";
  const sched::Schedule& s = plan->pipeline.schedule;
  ASSERT_EQ(s.workload().size(), 4 * 8 * 2);
  for (const sched::Block& b : s.workload().blocks()) {
    const double f_ms = fwd[static_cast<size_t>(b.stage.value())] * 1e3;
    EXPECT_EQ(b.duration, b.kind == sched::BlockKind::kF ? f_ms : 2 * f_ms) << b.to_string();
  }
  // The plan's figures are that schedule's, simulated.
  auto t = sched::simulate(s);
  ASSERT_TRUE(t.ok());
  EXPECT_DOUBLE_EQ(plan->pipeline.makespan_s, t->makespan * 1e-3);
  EXPECT_EQ(plan->pipeline.peak_micro_batches, t->peak_memory);
  EXPECT_DOUBLE_EQ(plan->estimate.ranks[0].compute_s, t->makespan * 1e-3);
  // Every rank runs the schedule's order.
  for (int d = 0; d < 4; ++d) {
    const auto order = s.device_order(DeviceId(d));
    const auto& blocks = plan->file.lowered.programs[static_cast<size_t>(d)].blocks;
    ASSERT_EQ(blocks.size(), order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      EXPECT_EQ(blocks[i].stage, order[i].stage);
      EXPECT_EQ(blocks[i].micro_batch, order[i].mb);
      EXPECT_EQ(blocks[i].kind == lower::BlockKind::kF, order[i].kind == sched::BlockKind::kF);
    }
  }
}

// What the plan dumps (schedule.csv, plan.json's schedule) is what search_schedule returns for
// the plan's stage costs, not 1F1B.
TEST(SearchedSchedule, ThePlanDumpsTheScheduleFound) {
  const Config c = search_config();
  auto plan = make_plan(c);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  const lower::StageCosts costs =
      stage_costs(*PlanSpec::of(c), plan->file.graph, plan->file.lowered, plan->cost);
  auto placement =
      lower::search_placement(c.parallel.pp, c.parallel.schedule == "search-zb", costs);
  ASSERT_TRUE(placement.ok()) << placement.error().message;
  auto found = sched::search_schedule(*placement, 8);
  ASSERT_TRUE(found.ok()) << found.error().message;
  auto csv = sched::to_csv(found->schedule);
  ASSERT_TRUE(csv.ok());
  EXPECT_EQ(plan->schedule.csv, *csv);
  EXPECT_EQ(plan->file.schedule_csv, *csv);
  auto one_f_one_b = make_plan(search_config({"parallel.schedule=1f1b"}));
  ASSERT_TRUE(one_f_one_b.ok());
  EXPECT_NE(plan->schedule.csv, one_f_one_b->schedule.csv);
}

// search-zb: the plan dumps the schedule searched on ZB-H1's placement at the plan's stage
// costs, each rank runs an F, an I and a W per micro-batch, and it is no slower than zb-h1's.
TEST(SearchedSchedule, SearchZbDumpsTheSplitScheduleFound) {
  const Config c = search_config({"parallel.schedule=search-zb"});
  auto plan = make_plan(c);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  const lower::StageCosts costs =
      stage_costs(*PlanSpec::of(c), plan->file.graph, plan->file.lowered, plan->cost);
  auto placement =
      lower::search_placement(c.parallel.pp, c.parallel.schedule == "search-zb", costs);
  ASSERT_TRUE(placement.ok()) << placement.error().message;
  sched::SearchOptions options;
  options.node_limit = lower::kSearchNodeLimit;
  auto found = sched::search_schedule(*placement, 8, options);
  ASSERT_TRUE(found.ok()) << found.error().message;
  auto csv = sched::to_csv(found->schedule);
  ASSERT_TRUE(csv.ok());
  EXPECT_EQ(plan->schedule.csv, *csv);
  EXPECT_NE(csv->find("I"), std::string::npos);
  EXPECT_NE(csv->find("W"), std::string::npos);
  for (const auto& program : plan->file.lowered.programs) {
    std::map<lower::BlockKind, int> count;
    for (const auto& b : program.blocks) ++count[b.kind];
    EXPECT_EQ(count[lower::BlockKind::kF], 8);
    EXPECT_EQ(count[lower::BlockKind::kI], 8);
    EXPECT_EQ(count[lower::BlockKind::kW], 8);
    EXPECT_EQ(count[lower::BlockKind::kB], 0);
  }
  auto zb = make_plan(search_config({"parallel.schedule=zb-h1"}));
  ASSERT_TRUE(zb.ok()) << zb.error().message;
  EXPECT_LE(plan->pipeline.makespan_s, zb->pipeline.makespan_s * (1 + 1e-9));
}

// A predefined schedule written as CSV and planned through parallel.schedule_csv is simulated
// at the same block durations as the predefined plan (B = 2 F; a split backward's I = W = F; a
// recomputing backward's forward again), so the two plans estimate the same makespan.
TEST(CsvSchedule, PlansAtThePredefinedSchedulesDurations) {
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"parallel.schedule=1f1b"},
        std::vector<std::string>{"parallel.schedule=zb-h1"},
        std::vector<std::string>{"parallel.schedule=zb-h1", "parallel.recompute=full"}}) {
    std::vector<std::string> overrides = {"parallel.dp=1", "parallel.tp=1"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    auto predefined = make_plan(config(overrides));
    ASSERT_TRUE(predefined.ok()) << predefined.error().message;
    const std::filesystem::path file =
        std::filesystem::path(testing::TempDir()) / ("loom_plan_csv_" + extra.back() + ".csv");
    std::ofstream(file) << predefined->schedule.csv;
    overrides.push_back("parallel.schedule=csv");
    overrides.push_back("parallel.schedule_csv=" + file.string());
    auto imported = make_plan(config(overrides));
    ASSERT_TRUE(imported.ok()) << imported.error().message;
    EXPECT_NEAR(imported->pipeline.makespan_s, predefined->pipeline.makespan_s,
                predefined->pipeline.makespan_s * 1e-9)
        << extra.back();
    EXPECT_EQ(imported->schedule.csv, predefined->schedule.csv) << extra.back();
  }
}

// A device memory that leaves the tightest rank room for two micro-batches' activations keeps
// at most two in flight there (and on every device no more than its room); one that leaves less
// than one is an error naming the key.
TEST(SearchedSchedule, TheDeviceMemoryBoundsTheMicroBatchesInFlight) {
  auto ample = make_plan(search_config());
  ASSERT_TRUE(ample.ok()) << ample.error().message;
  const Config c = search_config();
  const std::vector<RankMemory> memory =
      rank_memory(*PlanSpec::of(c), ample->file.graph, ample->file.lowered);
  ASSERT_EQ(memory.size(), 4u);
  // Room for 2.5 micro-batches on the tightest rank; for half of one on rank 3.
  double two = 0;
  size_t tightest = 0;
  for (size_t r = 0; r < memory.size(); ++r)
    if (memory[r].held_bytes + 2.5 * memory[r].activation_bytes > two) {
      two = memory[r].held_bytes + 2.5 * memory[r].activation_bytes;
      tightest = r;
    }
  const double none = memory[3].held_bytes + 0.5 * memory[3].activation_bytes;
  auto tight = make_plan(
      search_config({"cost.device_memory_bytes=" + std::to_string(static_cast<int64_t>(two))}));
  ASSERT_TRUE(tight.ok()) << tight.error().message;
  // Unbounded, the search holds many forwards to shorten the step (GPipe-like on device 0).
  EXPECT_GT(ample->pipeline.peak_micro_batches[tightest], 2);
  EXPECT_LE(tight->pipeline.peak_micro_batches[tightest], 2);
  for (size_t d = 0; d < 4; ++d) {
    const double room =
        std::floor((std::floor(two) - memory[d].held_bytes) / memory[d].activation_bytes);
    EXPECT_LE(tight->pipeline.peak_micro_batches[d], room) << "device " << d;
    EXPECT_LT(tight->pipeline.peak_micro_batches[d], 8) << "device " << d;
  }
  EXPECT_GT(tight->pipeline.makespan_s, ample->pipeline.makespan_s);

  auto impossible = make_plan(
      search_config({"cost.device_memory_bytes=" + std::to_string(static_cast<int64_t>(none))}));
  ASSERT_FALSE(impossible.ok());
  const std::string& msg = impossible.error().message;
  EXPECT_NE(msg.find("parallel.schedule"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cost.device_memory_bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("less than one micro-batch's activations"), std::string::npos) << msg;
}

// A PlanCache changes no plan: configs that share a model, a schedule search or neither, each
// planned twice through one cache (the second time from what the first kept), give the plan
// file and the estimate that make_plan gives without it; a config the degree checks refuse is
// refused with the same message when its model is in the cache.
TEST(PlanCache, PlansAreTheSameWithAndWithoutIt) {
  const std::vector<Config> configs = {
      search_config(),
      search_config({"parallel.schedule=search-zb"}),
      search_config({"parallel.schedule=search-zb", "parallel.recompute=full"}),
      search_config({"parallel.schedule=zb-h1", "parallel.recompute=selective"}),
      search_config({"parallel.pp=2", "parallel.dp=2", "parallel.schedule=search-zb"}),
      // One lowering shared by schedules that place the stages alike, recomputation levels and
      // ZeRO 0 and 1; chimera, two chunks per device and ZeRO 3 lower apart.
      search_config({"parallel.schedule=gpipe"}),
      search_config({"parallel.schedule=1f1b", "parallel.recompute=selective"}),
      search_config({"parallel.schedule=zb-h1", "parallel.zero=1"}),
      search_config({"parallel.schedule=chimera"}),
      search_config(
          {"parallel.pp=2", "parallel.dp=2", "parallel.schedule=interleaved", "parallel.chunks=2"}),
      config(),
      config({"parallel.zero=1"}),
      config({"parallel.zero=3"}),
      config({"batch.micro=1"}),
  };
  PlanCache cache;
  for (int pass = 0; pass < 2; ++pass)
    for (const Config& c : configs) {
      const CostModel cost = *resolve_cost_model(c);
      auto plain = make_plan(c, Registries{}, cost);
      auto cached = make_plan(c, Registries{}, cost, 0, {}, &cache);
      ASSERT_TRUE(plain.ok()) << plain.error().message;
      ASSERT_TRUE(cached.ok()) << cached.error().message;
      EXPECT_EQ(*lower::plan_to_json(cached->file), *lower::plan_to_json(plain->file));
      EXPECT_EQ(cached->schedule.csv, plain->schedule.csv);
      EXPECT_EQ(lower::model_digest(cached->model), lower::model_digest(plain->model));
      ASSERT_EQ(cached->estimate.ranks.size(), plain->estimate.ranks.size());
      EXPECT_EQ(cached->estimate.step_s, plain->estimate.step_s);
      EXPECT_EQ(cached->estimate.bubble_ratio, plain->estimate.bubble_ratio);
      // The estimate from the plan file alone (the fusion and the lowering's bytes found again,
      // not taken from what the lowering kept) is the plan's.
      const Estimate found = estimate_plan(*PlanSpec::of(c), plain->file.graph, plain->file.lowered,
                                           cost, plain->pipeline);
      ASSERT_EQ(found.ranks.size(), plain->estimate.ranks.size());
      for (size_t r = 0; r < plain->estimate.ranks.size(); ++r) {
        const RankEstimate& p = plain->estimate.ranks[r];
        EXPECT_EQ(cached->estimate.ranks[r].peak_bytes, p.peak_bytes);
        EXPECT_EQ(cached->estimate.ranks[r].comm_s, p.comm_s);
        EXPECT_EQ(cached->estimate.ranks[r].compute_s, p.compute_s);
        EXPECT_EQ(cached->estimate.ranks[r].activation_bytes, p.activation_bytes);
        EXPECT_EQ(found.ranks[r].peak_bytes, p.peak_bytes);
        EXPECT_EQ(found.ranks[r].activation_bytes, p.activation_bytes);
        EXPECT_EQ(found.ranks[r].parameters, p.parameters);
        EXPECT_EQ(found.ranks[r].optimizer_bytes, p.optimizer_bytes);
        EXPECT_EQ(found.ranks[r].step_s, p.step_s);
      }
      EXPECT_TRUE(prove(*cached, Registries{}).ok());
    }
  EXPECT_GT(cache.searches().searches(), 0);
  // search_config's 4 stages: one lowering for seven of its configs, one for chimera; pp 2 x
  // dp 2: one with a stage per device, one with two; config()'s: one for zero 0 and 1, one for
  // zero 3, one for batch.micro 1 (more micro-batches). The second pass makes none.
  EXPECT_EQ(cache.lowerings_made(), 7);
  // 8 stages of 6 layers: the model is in the cache (pp is no part of its key), the degree
  // checks refuse the config as without the cache.
  const Config bad = search_config({"parallel.pp=8"});
  auto plain = make_plan(bad, Registries{}, *resolve_cost_model(bad));
  auto cached = make_plan(bad, Registries{}, *resolve_cost_model(bad), 0, {}, &cache);
  ASSERT_FALSE(plain.ok());
  ASSERT_FALSE(cached.ok());
  EXPECT_EQ(cached.error().message, plain.error().message);
}

// Threads asking one cache for the same lowering at once: one makes it, the others wait for it
// rather than make it again, and every plan is the plan made without the cache.
TEST(PlanCache, ThreadsShareALoweringBeingMade) {
  const std::vector<Config> configs = {
      search_config({"parallel.schedule=1f1b"}),
      search_config({"parallel.schedule=gpipe"}),
      search_config({"parallel.schedule=zb-h1", "parallel.recompute=full"}),
      search_config({"parallel.schedule=search-zb"}),
  };
  PlanCache cache;
  std::vector<Result<Plan>> cached(configs.size(), Error::at("plan", "not made"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < configs.size(); ++i)
    threads.emplace_back([&, i] {
      cached[i] =
          make_plan(configs[i], Registries{}, *resolve_cost_model(configs[i]), 0, {}, &cache);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(cache.lowerings_made(), 1);
  for (size_t i = 0; i < configs.size(); ++i) {
    auto plain = make_plan(configs[i], Registries{}, *resolve_cost_model(configs[i]));
    ASSERT_TRUE(plain.ok()) << plain.error().message;
    ASSERT_TRUE(cached[i].ok()) << cached[i].error().message;
    EXPECT_EQ(*lower::plan_to_json(cached[i]->file), *lower::plan_to_json(plain->file));
    EXPECT_EQ(cached[i]->estimate.step_s, plain->estimate.step_s);
  }
}

}  // namespace
}  // namespace loom::plan
