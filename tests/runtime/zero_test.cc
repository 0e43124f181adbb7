// parallel.zero 1 (grad_buckets.h): each element of a shared parameter piece has one owner among
// the ranks holding it, which alone keeps its optimizer state and updates it; gradients are
// reduce-scattered to the owners and the updated values gathered back. Training equals one
// device, every shared element is owned exactly once, and checkpoints move between zero 1 and
// zero 0 (the owners write their state as slices; any plan reads them).
#include <cstring>
#include <filesystem>

#include "launch/planned_trainer.h"
#include "tests/runtime/checkpoint_moves.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

Config config(const std::vector<std::string>& overrides) {
  const char* yaml = R"(run: {seed: 3, steps: 6}
model: {type: gpt, preset: tiny}
batch: {global: 8, micro: 2}
optimizer: {type: adamw, lr: 0.002, weight_decay: 0.1, clip_grad_norm: 1.0}
comm: {timeout_s: 60, bucket_mb: 0.01}
)";
  auto c = parse_config(yaml, "zero.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

const testing_support::Reference& reference(const std::vector<std::string>& optimizer) {
  static std::map<std::vector<std::string>, testing_support::Reference> cache;
  auto it = cache.find(optimizer);
  if (it == cache.end())
    it = cache.emplace(optimizer, testing_support::train_single_device(config(optimizer), 5)).first;
  return it->second;
}

// Equal to one device, and every element of the shared pieces is owned by exactly one of the
// ranks holding it: summed over ranks, the owned elements are 1/k of the elements held by k
// ranks each (10 KiB buckets, so pieces are cut at segment borders in many places).
void expect_zero1(std::vector<std::string> overrides, int world_size,
                  const std::vector<std::string>& optimizer = {}) {
  overrides.push_back("parallel.zero=1");
  std::vector<std::string> all = overrides;
  all.insert(all.end(), optimizer.begin(), optimizer.end());
  testing_support::expect_equal_to_single_device(reference(optimizer), config(all), world_size,
                                                 {"attn.k.b"});
  comm::LocalWorld world(world_size, 60);
  std::vector<double> owned(world_size), share(world_size), shared(world_size);
  auto statuses = world.run([&](comm::Comm& comm) -> Status {
    at::set_num_threads(1);
    LOOM_ASSIGN_OR_RETURN(auto trainer,
                          launch::create_trainer(config(all), comm.shared_from_this()));
    const auto& exec = trainer->executor();
    const auto mine = exec.parameter_owned();
    const int64_t r = comm.world_rank().value();
    for (size_t i = 0; i < exec.parameters().size(); ++i) {
      const double n = static_cast<double>(exec.parameters()[i].numel());
      const int64_t k = exec.parameter_replicas()[i];
      const auto [begin, end] = mine[i];
      if (k == 1) {
        if (begin != 0 || end != exec.parameters()[i].numel())
          return Error::at("zero", "an unshared piece is not owned whole");
        continue;
      }
      shared[r] += n;
      share[r] += n / static_cast<double>(k);
      owned[r] += static_cast<double>(end - begin);
    }
    return Status::success();
  });
  double owned_total = 0, share_total = 0;
  for (int r = 0; r < world_size; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r].error().message;
    EXPECT_LT(owned[r], shared[r]) << "rank " << r << " owns every shared piece";
    owned_total += owned[r];
    share_total += share[r];
  }
  EXPECT_GT(share_total, 0);
  EXPECT_NEAR(owned_total, share_total, 0.5);
}

TEST(Zero1, Dp2AdamW) { expect_zero1({"parallel.dp=2"}, 2); }
TEST(Zero1, Dp2Tp2AdamW) { expect_zero1({"parallel.dp=2", "parallel.tp=2"}, 4); }
TEST(Zero1, Dp2Pp2AdamW) { expect_zero1({"parallel.dp=2", "parallel.pp=2"}, 4); }
TEST(Zero1, Dp2Pp2Sgd) {
  expect_zero1({"parallel.dp=2", "parallel.pp=2"}, 4,
               {"optimizer.type=sgd", "optimizer.lr=0.3", "optimizer.momentum=0.9"});
}

// A zero-1 checkpoint holds each piece's optimizer state once, written by its owner as boxes:
// read whole it is one device's state; one device resumes from it as from its own, and a dp2
// zero-1 run resumes from one device's.
TEST(Zero1, CheckpointsMoveBetweenZero1AndZero0) {
  // 50 KiB buckets hold several pieces each, so segment borders cut matrices mid-row and a
  // piece's owned elements are several boxes.
  testing_support::expect_checkpoints_move(
      config, {"parallel.dp=2", "parallel.zero=1", "comm.bucket_mb=0.05"}, 2, "zero1");
}

}  // namespace
}  // namespace loom
