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
