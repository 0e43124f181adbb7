// Test support: a plan is correct when its losses and parameters equal the single-device run's.
// Trains a config on one device, then on several ranks as threads over the local backend, and
// compares every rank's losses and every parameter piece. Shared by the model tests.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "comm/local_comm.h"
#include "graph/verify.h"
#include "launch/planned_trainer.h"
#include "lower/plan_file.h"
#include "models/model.h"
#include "plan/plan.h"
#include "runtime/executor.h"
#include "runtime/inputs.h"
#include "runtime/oracle.h"
#include "runtime/trainer.h"
#include "tests/support/plan_chain.h"
#include "tests/support/reference_run.h"

namespace loom::testing_support {

// Trains `config` (world_size ranks) for as many steps as `ref` has losses; every rank's loss
// must be within loss_tolerance (tolerance.h) of the reference and every parameter piece within the
// policy's bound for the reference's optimizer (tests/support/tolerance.h). Parameters whose name
// contains one of `noise` are not compared: their gradients are rounding noise by construction
// (a bias that shifts every softmax score alike).
// With `plan`, the ranks run that plan (read from plan.json) instead of making one.
inline void expect_equal_to_single_device(const Reference& ref, const Config& config,
                                          int world_size,
                                          const std::vector<std::string>& noise = {},
                                          const lower::PlanFile* plan = nullptr) {
  const int steps = static_cast<int>(ref.losses.size());
  ASSERT_GT(steps, 1);
  // The losses move, so equal curves are not equal constants.
  ASSERT_NE(ref.losses.front(), ref.losses.back());
  comm::LocalWorld world(world_size, 60);
  std::mutex mu;
  std::vector<std::vector<double>> losses(static_cast<size_t>(world_size));
  std::vector<std::string> problems;
  std::set<std::string> held;  // every parameter some rank holds
  auto statuses = world.run([&](comm::Comm& comm) -> Status {
    at::set_num_threads(1);
    LOOM_ASSIGN_OR_RETURN(auto trainer,
                          launch::create_trainer(config, comm.shared_from_this(), plan));
    const int64_t rank = comm.world_rank().value();
    for (int i = 0; i < steps; ++i) {
      LOOM_ASSIGN_OR_RETURN(auto st, trainer->step());
      losses[static_cast<size_t>(rank)].push_back(st.loss);
    }
    auto& exec = trainer->executor();
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < exec.parameters().size(); ++i) {
      const graph::SubTensor& piece = exec.parameter_pieces()[i];
      const std::string& name = trainer->graph().tensor(piece.tensor).name;
      held.insert(name);
      if (is_noise(name, noise)) continue;
      const auto differs = compare_parameter(
          exec.parameters()[i], runtime::cut_piece(ref.params.at(name), piece),
          runtime::cut_piece(ref.init.at(name), piece), parameter_tolerance(ref.trace, name));
      if (differs)
        problems.push_back("rank " + std::to_string(rank) + " " + name + piece.ranges_string() +
                           ": " + *differs);
    }
    return Status::success();
  });
  for (int r = 0; r < world_size; ++r) ASSERT_TRUE(statuses[r].ok()) << statuses[r].error().message;
  for (int r = 0; r < world_size; ++r) {
    ASSERT_EQ(losses[static_cast<size_t>(r)].size(), ref.losses.size()) << "rank " << r;
    for (int i = 0; i < steps; ++i)
      EXPECT_LE(std::abs(losses[r][i] - ref.losses[i]) / ref.losses[i], loss_tolerance(ref.trace))
          << "rank " << r << " step " << i + 1 << ": " << losses[r][i] << " vs " << ref.losses[i];
  }
  // Every parameter of the model is held (and so compared) somewhere.
  EXPECT_EQ(held.size(), ref.params.size());
  EXPECT_TRUE(problems.empty()) << problems.size() << " pieces differ, first: " << problems[0];
}

// The per-op oracle: every sub-operator of the plan computes exactly the piece of the
// single-device run it claims (before any communication exists), on the first micro-batch of
// the trainer's inputs.
inline void expect_ops_correct(const Config& config) {
  auto ops = graph::OpRegistry::with_builtin_ops();
  auto kernels = runtime::KernelRegistry::with_builtin_kernels();
  auto single = testing_support::single_device_graph(config, ops);
  ASSERT_TRUE(single.ok()) << single.error().message;
  auto feeder = runtime::InputFeeder::create(config, *single);
  ASSERT_TRUE(feeder.ok()) << feeder.error().message;
  auto inputs = (*feeder)->micro_batch(0);
  ASSERT_TRUE(inputs.ok()) << inputs.error().message;
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> values = runtime::reference_values(*single, kernels, 11, *inputs);
  auto plan = loom::plan::planned_graph(config, testing_support::registries_with(ops),
                                        config.parallel.world_size());
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  Status v = graph::verify(*plan, ops);
  EXPECT_TRUE(v.ok()) << v.error().message;
  runtime::OracleReport report = runtime::check_plan_ops(*plan, values, kernels);
  EXPECT_TRUE(report.ok()) << report.mismatches.size() << " mismatches, first: "
                           << (report.mismatches.empty() ? "" : report.mismatches[0]);
  EXPECT_EQ(report.ops_checked, static_cast<int64_t>(plan->ops().size()));
}

// Trains `config` on `world_size` local ranks for `steps` steps, saving a checkpoint every step
// into `dir` and resuming from `resume` when given; returns rank 0's losses.
inline std::vector<double> train_with_checkpoints(const Config& config, int world_size, int steps,
                                                  const std::string& dir,
                                                  const std::string& resume = "") {
  std::string yaml = to_yaml(config);
  std::vector<std::string> keys = {"checkpoint.dir=" + dir, "checkpoint.every=1",
                                   "checkpoint.keep=10"};
  if (!resume.empty()) keys.push_back("checkpoint.resume=" + resume);
  auto saving = parse_config(yaml, "checkpointed run", keys);
  EXPECT_TRUE(saving.ok()) << saving.error().message;
  if (!saving.ok()) return {};
  comm::LocalWorld world(world_size, 60);
  std::vector<double> losses;
  auto statuses = world.run([&](comm::Comm& comm) -> Status {
    at::set_num_threads(1);
    LOOM_ASSIGN_OR_RETURN(auto trainer, launch::create_trainer(*saving, comm.shared_from_this()));
    for (int i = 0; i < steps; ++i) {
      LOOM_ASSIGN_OR_RETURN(auto st, trainer->step());
      if (comm.world_rank().value() == 0) losses.push_back(st.loss);
    }
    return Status::success();
  });
  for (int r = 0; r < world_size; ++r) EXPECT_TRUE(statuses[r].ok()) << statuses[r].error().message;
  return losses;
}

}  // namespace loom::testing_support
