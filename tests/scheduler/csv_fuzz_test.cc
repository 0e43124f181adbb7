// Fuzzing the schedule CSV reader (schedules imported from torchtitan) with the seeded mutator,
// bounded by an iteration count and a few seconds: a schedule or an error, never a crash.
#include <gtest/gtest.h>

#include "scheduler/csv.h"
#include "tests/core/mutator.h"

namespace loom::sched {
namespace {

TEST(Fuzz, ScheduleCsv) {
  const std::vector<std::string> corpus = {
      "0F0,0F1,,0B0,,0B1\n,1F0,1B0,1F1,1B1,\n",
      "0F0,0F1,0F2,0F3,,,0B0,,0B1,,0B2,,0B3\n,1F0,1F1,1F2,1F3,1B0,,1B1,,1B2,,1B3,\n",
      "0F0,0I0,0W0\n"};
  testing::Mutator mutator(0xC5F);
  int errors = 0;
  const int ran = testing::run_bounded(3000, 4.0, [&](int i) {
    auto s = from_csv(mutator.mutate(corpus[static_cast<size_t>(mutator.pick(3))]));
    if (!s.ok()) {
      ++errors;
      EXPECT_FALSE(s.error().message.empty()) << "iteration " << i;
    }
  });
  std::printf("schedule csv: %d inputs, %d rejected\n", ran, errors);
  EXPECT_GT(errors, 0);
}

}  // namespace
}  // namespace loom::sched
