// Multi-rank training equals one device: GPT tiny under a plan, ranks as threads over the local
// backend, 10 steps; losses and every parameter piece against the single-device run.
// Tolerances: tests/support/tolerance.h, per optimizer (SGD is linear in the gradient and held to
// 1e-5 of each parameter's travel; AdamW's sign-like update gets its own floor).
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "plan/plan.h"
#include "scheduler/csv.h"
#include "scheduler/predefined.h"
#include "tests/runtime/local_ranks.h"

namespace loom {
namespace {

constexpr int kSteps = 10;

Config config(const std::vector<std::string>& overrides) {
  const char* yaml = R"(run: {seed: 3, steps: 10}
model: {type: gpt, preset: tiny}
batch: {global: 8, micro: 2}
optimizer: {type: sgd, lr: 0.3, momentum: 0.9, weight_decay: 0.01, clip_grad_norm: 1.0}
comm: {timeout_s: 60}
)";
  auto c = parse_config(yaml, "d.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

// The key projection's bias cannot change the output (softmax ignores a shift shared by all
// keys): its gradient is rounding noise, which Adam amplifies; see gpt_reference_test.
const std::vector<std::string> kNoise = {"attn.k.b"};

const testing_support::Reference& single_device(const std::vector<std::string>& optimizer) {
  static std::map<std::vector<std::string>, testing_support::Reference> cache;
  auto it = cache.find(optimizer);
  if (it == cache.end())
    it = cache.emplace(optimizer, testing_support::train_single_device(config(optimizer), kSteps))
             .first;
  return it->second;
}

void expect_equal_to_single_device(std::vector<std::string> overrides, int world_size,
                                   const std::vector<std::string>& optimizer = {}) {
  const testing_support::Reference& ref = single_device(optimizer);
  overrides.insert(overrides.end(), optimizer.begin(), optimizer.end());
  testing_support::expect_equal_to_single_device(ref, config(overrides), world_size, kNoise);
}

TEST(LocalRanks, Dp2) { expect_equal_to_single_device({"parallel.dp=2"}, 2); }
TEST(LocalRanks, Tp2) { expect_equal_to_single_device({"parallel.tp=2"}, 2); }
TEST(LocalRanks, Pp2) { expect_equal_to_single_device({"parallel.pp=2"}, 2); }
TEST(LocalRanks, Tp2Sp) { expect_equal_to_single_device({"parallel.tp=2", "parallel.sp=true"}, 2); }
TEST(LocalRanks, Dp2Tp2) { expect_equal_to_single_device({"parallel.dp=2", "parallel.tp=2"}, 4); }
TEST(LocalRanks, Tp2Pp2) { expect_equal_to_single_device({"parallel.tp=2", "parallel.pp=2"}, 4); }
TEST(LocalRanks, Dp2Pp2) { expect_equal_to_single_device({"parallel.dp=2", "parallel.pp=2"}, 4); }
TEST(LocalRanks, Dp2Tp2Pp2) {
  expect_equal_to_single_device({"parallel.dp=2", "parallel.tp=2", "parallel.pp=2"}, 8);
}
// Recomputation changes what a forward keeps, never what it computes: one device and every
// plan equal the single device that keeps everything. The tp and dp plans recompute regions
// holding tensor-parallel collectives (run again inside the backward).
TEST(Recompute, FullOneDevice) { expect_equal_to_single_device({"parallel.recompute=full"}, 1); }
TEST(Recompute, SelectiveOneDevice) {
  expect_equal_to_single_device({"parallel.recompute=selective"}, 1);
}
TEST(Recompute, FullTp2Pp2) {
  expect_equal_to_single_device({"parallel.recompute=full", "parallel.tp=2", "parallel.pp=2"}, 4);
}
TEST(Recompute, SelectiveDp2Tp2Sp) {
  expect_equal_to_single_device(
      {"parallel.recompute=selective", "parallel.dp=2", "parallel.tp=2", "parallel.sp=true"}, 4);
}
TEST(Recompute, FullDp2Tp2AdamW) {
  expect_equal_to_single_device({"parallel.recompute=full", "parallel.dp=2", "parallel.tp=2"}, 4,
                                {"optimizer.type=adamw", "optimizer.lr=0.002"});
}

// Pipeline schedules from the scheduler drive each rank's order of blocks.
void expect_schedule(const std::string& schedule, int pp, int chunks) {
  expect_equal_to_single_device(
      {"parallel.pp=" + std::to_string(pp), "parallel.chunks=" + std::to_string(chunks),
       "parallel.schedule=" + schedule},
      pp, {"model.args.layers=8"});
}
TEST(Schedules, GPipePp2) { expect_schedule("gpipe", 2, 1); }
TEST(Schedules, OneFOneBPp2) { expect_schedule("1f1b", 2, 1); }
TEST(Schedules, OneFOneBPp4) { expect_schedule("1f1b", 4, 1); }
TEST(Schedules, GPipePp4) { expect_schedule("gpipe", 4, 1); }
TEST(Schedules, InterleavedPp2Chunks2) { expect_schedule("interleaved", 2, 2); }
TEST(Schedules, InterleavedPp4Chunks2) { expect_schedule("interleaved", 4, 2); }
TEST(Schedules, LoopedBfsPp2Chunks2) { expect_schedule("looped-bfs", 2, 2); }
TEST(Schedules, SearchPp2) { expect_schedule("search", 2, 1); }
// Chimera: two pipelines in opposite directions, each a replica of the model over half the
// micro-batches, with their parameter gradients summed over the replicas.
TEST(Schedules, ChimeraPp2) { expect_schedule("chimera", 2, 1); }
TEST(Schedules, ChimeraPp4) { expect_schedule("chimera", 4, 1); }
TEST(Schedules, ChimeraDp2Pp2) {
  expect_equal_to_single_device(
      {"parallel.dp=2", "parallel.pp=2", "parallel.schedule=chimera", "batch.micro=1"}, 4);
}
TEST(Schedules, SearchPp4) { expect_schedule("search", 4, 1); }
// Zero bubble: every backward split into I (input gradients) and W (the weight matrix products,
// deferred: runtime/deferred_linear.h).
TEST(Schedules, SearchZbPp2) { expect_schedule("search-zb", 2, 1); }
TEST(Schedules, SearchZbPp4) { expect_schedule("search-zb", 4, 1); }
TEST(Schedules, ZbH1Pp2) { expect_schedule("zb-h1", 2, 1); }
TEST(Schedules, ZbH1Pp4) { expect_schedule("zb-h1", 4, 1); }
TEST(Schedules, ZbH1Tp2Pp2) {
  expect_equal_to_single_device({"parallel.tp=2", "parallel.pp=2", "parallel.schedule=zb-h1"}, 4);
}
// A recomputed layer's backward in an I block: its linears defer their weight gradients to W
// from inside the recomputation.
TEST(Schedules, ZbH1Tp2Pp2RecomputeFull) {
  expect_equal_to_single_device(
      {"parallel.tp=2", "parallel.pp=2", "parallel.schedule=zb-h1", "parallel.recompute=full"}, 4);
}
// A predefined schedule exported as torch.distributed.pipelining CSV (what `loom schedule --csv`
// writes) and read back through parallel.schedule_csv trains equal to one device.
void expect_csv_schedule(sched::ScheduleKind kind, int pp, int chunks) {
  const int m = 4;  // batch.global 8 / batch.micro 2
  auto s = sched::build_predefined(kind, sched::PipelineSpec::of(pp, m, chunks));
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  auto csv = sched::to_csv(*s);
  ASSERT_TRUE(csv.ok()) << csv.error().to_string();
  const std::filesystem::path file =
      std::filesystem::path(testing::TempDir()) /
      ("loom_" + sched::to_string(kind) + "_pp" + std::to_string(pp) + ".csv");
  std::ofstream(file) << *csv;
  expect_equal_to_single_device(
      {"parallel.pp=" + std::to_string(pp), "parallel.chunks=" + std::to_string(chunks),
       "parallel.schedule=csv", "parallel.schedule_csv=" + file.string()},
      pp, {"model.args.layers=8"});
}
TEST(Schedules, CsvOneFOneBPp2) { expect_csv_schedule(sched::ScheduleKind::k1F1B, 2, 1); }
TEST(Schedules, CsvInterleavedPp2Chunks2) {
  expect_csv_schedule(sched::ScheduleKind::kInterleaved, 2, 2);
}
TEST(Schedules, CsvZbH1Pp2) { expect_csv_schedule(sched::ScheduleKind::kZbH1, 2, 1); }

// A looped zero-bubble schedule as torch.distributed.pipelining's compute CSVs from before it
// named the input gradient I write it (stages 0 and 2 on rank 0, 1 and 3 on rank 1; each split
// backward a B followed, some blocks later, by its W), and the same file in torch's current
// names. Both read as I + W blocks and train equal to one device.
constexpr const char* kLoopedZbOlderNames =
    "0F0,0F1,2F0,2F1,0F2,2B0,0F3,2B1,2W0,2F2,0B0,2W1,2F3,0B1,0W0,2B2,0W1,2B3,2W2,0B2,2W3,0B3,0W2,"
    "0W3\n"
    ",1F0,1F1,3F0,3B0,3F1,3B1,3W0,1F2,1B0,3W1,1F3,1B1,1W0,3F2,3B2,1W1,3F3,3B3,3W2,1B2,3W3,1B3,1W2,"
    "1W3\n";

void expect_torch_csv(const std::string& name, const std::string& text, sched::CsvActions read_as) {
  const std::filesystem::path file = std::filesystem::path(testing::TempDir()) / name;
  std::ofstream(file) << text;
  const std::vector<std::string> keys = {"parallel.pp=2", "parallel.chunks=2",
                                         "parallel.schedule=csv",
                                         "parallel.schedule_csv=" + file.string()};
  std::vector<std::string> planned = keys;
  planned.push_back("model.args.layers=8");
  auto plan = plan::make_plan(config(planned));
  ASSERT_TRUE(plan.ok()) << plan.error().to_string();
  EXPECT_EQ(plan->schedule.read_as, read_as);
  expect_equal_to_single_device(keys, 2, {"model.args.layers=8"});
}
TEST(Schedules, CsvTorchOlderNamesLoopedZbPp2Chunks2) {
  expect_torch_csv("loom_torch_older_names.csv", kLoopedZbOlderNames,
                   sched::CsvActions::kBackwardWeight);
}
TEST(Schedules, CsvTorchCurrentNamesLoopedZbPp2Chunks2) {
  std::string current = kLoopedZbOlderNames;
  // Every B of this file has its W: each is an input gradient.
  std::replace(current.begin(), current.end(), 'B', 'I');
  expect_torch_csv("loom_torch_current_names.csv", current, sched::CsvActions::kInputWeight);
}

TEST(LocalRanks, Dp2Tp2Pp2SpAdamW) {
  expect_equal_to_single_device(
      {"parallel.dp=2", "parallel.tp=2", "parallel.pp=2", "parallel.sp=true"}, 8,
      {"optimizer.type=adamw", "optimizer.lr=0.002"});
}

}  // namespace
}  // namespace loom
