// Test support for checkpoints that move between plans (ZeRO 1 and 3 against one device).
#pragma once

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/reader.h"
#include "tests/runtime/local_ranks.h"

namespace loom::testing_support {

namespace fs = std::filesystem;

// Every element of every optimizer state tensor in checkpoint `got` against `want`, read whole
// (so a zero-1 checkpoint's boxes are assembled from both ranks' shards). The moments are sums of
// gradients that a dp2 run reduces in another order: after 3 steps they differ from one device's
// by float rounding (below 1e-5 of the tensor's largest entry); 1e-3 leaves a margin, and a box
// written at the wrong place moves entries by the size of the entries themselves.
inline void expect_same_optimizer_state(const fs::path& got, const fs::path& want) {
  auto a = CheckpointReader::open(got);
  auto b = CheckpointReader::open(want);
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_TRUE(b.ok()) << b.error().message;
  int64_t compared = 0;
  for (const char* kind : {kSliceExpAvg, kSliceExpAvgSq})
    for (const std::string& name : b->tensors(kind)) {
      if (name.find("attn.k.b") != std::string::npos) continue;  // rounding noise (see above)
      auto shape = b->describe(name, kind);
      ASSERT_TRUE(shape.ok()) << shape.error().message;
      SliceRanges whole;
      for (int64_t d : shape->first) whole.emplace_back(0, d);
      auto x = a->read(name, kind, whole);
      auto y = b->read(name, kind, whole);
      ASSERT_TRUE(x.ok()) << name << ": " << x.error().message;
      ASSERT_TRUE(y.ok()) << name << ": " << y.error().message;
      ASSERT_EQ(x->size(), y->size());
      std::vector<float> u(x->size() / 4), v(y->size() / 4);
      std::memcpy(u.data(), x->data(), x->size());
      std::memcpy(v.data(), y->data(), y->size());
      double largest = 0, worst = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        largest = std::max(largest, std::abs(static_cast<double>(v[i])));
        worst = std::max(worst, std::abs(static_cast<double>(u[i]) - v[i]));
      }
      EXPECT_LE(worst, 1e-3 * largest + 1e-12) << kind << " " << name;
      ++compared;
    }
  EXPECT_GT(compared, 10);
}

// One device trains 5 steps; `plan` (on `world_size` local ranks) trains 3 and saves them. Its
// checkpoint holds the same optimizer state as one device's after 3 steps; one device resumes
// from it, and `plan` from one device's, each with the uninterrupted run's losses for steps 4
// and 5. `config` makes the tests' config of its overrides.
inline void expect_checkpoints_move(
    const std::function<Config(const std::vector<std::string>&)>& config,
    const std::vector<std::string>& plan, int world_size, const std::string& name) {
  const fs::path root =
      fs::temp_directory_path() / ("loom_" + name + "_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(root);
  auto train = [&](const std::vector<std::string>& overrides, int ranks, int steps,
                   const fs::path& dir, const fs::path& resume) {
    return train_with_checkpoints(config(overrides), ranks, steps, dir.string(),
                                  resume.empty() ? "" : resume.string());
  };
  const std::vector<double> whole = train({}, 1, 5, root / "one", {});
  ASSERT_EQ(whole.size(), 5u);
  ASSERT_EQ(train(plan, world_size, 3, root / "plan", {}).size(), 3u);
  expect_same_optimizer_state(root / "plan" / "step_00000003", root / "one" / "step_00000003");
  const std::vector<double> from_plan =
      train({}, 1, 2, root / "resumed_one", root / "plan" / "step_00000003");
  const std::vector<double> from_one =
      train(plan, world_size, 2, root / "resumed_plan", root / "one" / "step_00000003");
  ASSERT_EQ(from_plan.size(), 2u);
  ASSERT_EQ(from_one.size(), 2u);
  // The tolerance policy's loss bound: resumed runs sum the same terms in another order.
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(from_plan[i], whole[3 + i], whole[3 + i] * kLossRelTolerance) << "step " << 4 + i;
    EXPECT_NEAR(from_one[i], whole[3 + i], whole[3 + i] * kLossRelTolerance) << "step " << 4 + i;
  }
  fs::remove_all(root);
}

}  // namespace loom::testing_support
