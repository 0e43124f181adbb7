// The counting CPU allocator: live bytes follow tensors exactly, the peak holds the most live
// bytes since the last reset, and a training step reports at least what must be live in it.
#include "runtime/memory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "launch/planned_trainer.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"

namespace loom::runtime {
namespace {

TEST(CpuMemory, LiveBytesFollowTensorsAndThePeakHolds) {
  track_cpu_memory();
  ASSERT_TRUE(cpu_memory_tracked());
  const int64_t before = live_cpu_bytes();
  reset_peak_cpu_bytes();
  {
    at::Tensor a = at::empty({1000}, at::kFloat);  // 4000 bytes
    EXPECT_EQ(live_cpu_bytes() - before, 4000);
    {
      at::Tensor b = at::empty({250, 4}, at::kDouble);  // 8000 bytes
      EXPECT_EQ(live_cpu_bytes() - before, 12000);
    }
    EXPECT_EQ(live_cpu_bytes() - before, 4000);
    EXPECT_EQ(peak_cpu_bytes() - before, 12000);
    at::Tensor view = a.slice(0, 0, 10);  // a view allocates nothing
    EXPECT_EQ(live_cpu_bytes() - before, 4000);
  }
  EXPECT_EQ(live_cpu_bytes(), before);
  reset_peak_cpu_bytes();
  EXPECT_EQ(peak_cpu_bytes(), before);
}

// A freed block of 1 MiB or more is taken back by the next allocation of about its size (so it
// is not page-faulted in again), and counts as live only while a tensor holds it.
TEST(CpuMemory, LargeFreedBlocksAreReusedAndNotCountedLive) {
  track_cpu_memory();
  const int64_t before = live_cpu_bytes();
  constexpr int64_t kFloats = int64_t{40} << 20 >> 2;  // 40 MiB
  void* first = nullptr;
  {
    at::Tensor a = at::empty({kFloats}, at::kFloat);
    first = a.data_ptr();
    EXPECT_EQ(live_cpu_bytes() - before, kFloats * 4);
  }
  EXPECT_EQ(live_cpu_bytes(), before);
  const int64_t reuses = large_cpu_block_reuses();
  {
    at::Tensor b = at::ones({kFloats - 1000}, at::kFloat);  // a little smaller: the same block
    EXPECT_EQ(b.data_ptr(), first);
    EXPECT_EQ(large_cpu_block_reuses(), reuses + 1);
    EXPECT_EQ(live_cpu_bytes() - before, (kFloats - 1000) * 4);
    EXPECT_EQ(b.sum().item<double>(), static_cast<double>(kFloats - 1000));
    // Half the size is not served by the 40 MiB block (it would waste more than an eighth).
    at::Tensor c = at::empty({kFloats / 2}, at::kFloat);
    EXPECT_EQ(large_cpu_block_reuses(), reuses + 1);
  }
  EXPECT_EQ(live_cpu_bytes(), before);
}

TEST(CpuMemory, AStepReportsAtLeastParametersGradientsAndAdamState) {
  auto c = parse_config(
      "run: {steps: 2}\nmodel: {type: gpt, preset: tiny}\nbatch: {global: 8, micro: 4}\n",
      "m.yaml");
  ASSERT_TRUE(c.ok());
  auto t = launch::create_trainer(*c);
  ASSERT_TRUE(t.ok()) << t.error().message;
  int64_t param_bytes = 0;
  for (const auto& p : (*t)->executor().parameters()) param_bytes += p.numel() * 4;
  (void)(*t)->step();
  auto st = (*t)->step();
  ASSERT_TRUE(st.ok());
  // Parameters, gradients and AdamW's two moments are live across the whole second step.
  EXPECT_GE(st->peak_mem_bytes, 4 * param_bytes);
  // Activations come on top: GPT tiny's logits alone are 4 x 32 x 256 floats.
  EXPECT_GE(st->peak_mem_bytes, 4 * param_bytes + 4 * 32 * 256 * 4);
  // Steady state: what a step frees is subtracted, so live bytes do not grow from step to step
  // (estimate-vs-measured bounds from above are MemoryEstimate's, in the multi-process tests).
  const int64_t after_two = live_cpu_bytes();
  ASSERT_TRUE((*t)->step().ok());
  EXPECT_EQ(live_cpu_bytes(), after_two);
}

}  // namespace
}  // namespace loom::runtime
