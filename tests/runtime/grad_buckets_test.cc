// Gradient buckets started during backward (runtime/grad_buckets.h): with buckets small
// enough that a model needs many, data and tensor parallel runs still equal one device, and
// most buckets start before backward ends.
#include "runtime/grad_buckets.h"

#include "launch/planned_trainer.h"
#include "tests/runtime/local_ranks.h"

namespace loom {
namespace {

Config config(const std::vector<std::string>& overrides) {
  const char* yaml = R"(run: {seed: 3}
model: {type: gpt, preset: tiny}
batch: {global: 8, micro: 2}
optimizer: {type: sgd, lr: 0.3, momentum: 0.9, weight_decay: 0.01, clip_grad_norm: 1.0}
comm: {timeout_s: 60, bucket_mb: 0.01}
)";
  auto c = parse_config(yaml, "buckets.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

const testing_support::Reference& reference() {
  static const testing_support::Reference ref = testing_support::train_single_device(config({}), 4);
  return ref;
}

// Buckets of 10 KiB: GPT tiny's shared gradients fill dozens.
void expect_buckets_overlap(const std::vector<std::string>& overrides, int world_size) {
  testing_support::expect_equal_to_single_device(reference(), config(overrides), world_size,
                                                 {"attn.k.b"});
  comm::LocalWorld world(world_size, 60);
  std::vector<int64_t> buckets(world_size), early(world_size);
  auto statuses = world.run([&](comm::Comm& comm) -> Status {
    at::set_num_threads(1);
    LOOM_ASSIGN_OR_RETURN(auto trainer,
                          launch::create_trainer(config(overrides), comm.shared_from_this()));
    LOOM_ASSIGN_OR_RETURN(auto stats, trainer->step());
    (void)stats;
    const auto* b = trainer->executor().gradient_buckets();
    const int64_t r = comm.world_rank().value();
    buckets[r] = b ? b->bucket_count() : 0;
    early[r] = b ? b->started_during_backward() : 0;
    return Status::success();
  });
  for (int r = 0; r < world_size; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r].error().message;
    EXPECT_GE(buckets[r], 5) << "rank " << r;
    // Every bucket but the one holding the first-used parameters (the embeddings, whose
    // gradients are final last) starts before backward ends.
    EXPECT_GE(early[r], buckets[r] - 1) << "rank " << r;
  }
}

TEST(GradBuckets, Dp2StartDuringBackward) { expect_buckets_overlap({"parallel.dp=2"}, 2); }
TEST(GradBuckets, Dp2Pp2StartDuringBackward) {
  expect_buckets_overlap({"parallel.dp=2", "parallel.pp=2"}, 4);
}
// Split backwards: weight gradients arrive in W blocks, outside autograd, and count too.
TEST(GradBuckets, Dp2Pp2ZbH1StartDuringBackward) {
  expect_buckets_overlap({"parallel.dp=2", "parallel.pp=2", "parallel.schedule=zb-h1"}, 4);
}
TEST(GradBuckets, Dp2Tp2StartDuringBackward) {
  expect_buckets_overlap({"parallel.dp=2", "parallel.tp=2"}, 4);
}

}  // namespace
}  // namespace loom
