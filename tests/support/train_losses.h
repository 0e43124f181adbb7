// Test support: the losses of a single-process run of a config, step by step, each failure
// reported where it happens (an empty or short result then fails the caller's size check).
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "core/config.h"
#include "launch/planned_trainer.h"

namespace loom::testing_support {

inline std::vector<double> train_losses(const Config& config, int steps) {
  std::vector<double> out;
  auto t = launch::create_trainer(config);
  EXPECT_TRUE(t.ok()) << t.error().message;
  if (!t.ok()) return out;
  for (int i = 0; i < steps; ++i) {
    auto st = (*t)->step();
    EXPECT_TRUE(st.ok()) << st.error().message;
    if (!st.ok()) break;
    out.push_back(st->loss);
  }
  return out;
}

}  // namespace loom::testing_support
