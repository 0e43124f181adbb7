// loom's embedding API: train from your own program. A Trainer is built from a config file or
// a Config made in code; user code may add op types (an annotation string and, in
// loom/kernel.h, a LibTorch kernel), parallel policies and a model builder. This header does
// not include LibTorch.
//
//   loom::Setup setup;
//   setup.add_op(loom::graph::OpSchema::simple("swish", "b s h -> b s h"));
//   loom::add_kernel(setup, "swish", [](auto&, auto& in) { return
//   std::vector{in[0].mul(in[0].sigmoid())}; });
//   setup.set_model([](const loom::Config& c, const loom::GraphShape& shape,
//                      const loom::graph::OpRegistry& ops) { ... });
//   auto trainer = loom::Trainer::from_file("run.yaml", {"parallel.tp=2"}, setup);
//   (*trainer)->on_step([](const loom::StepStats& s) { std::printf("%f\n", s.loss); });
//   (*trainer)->fit();
//
// Several ranks: start the program with loomrun (or mpirun); each process is one rank.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/result.h"
#include "graph/builder.h"
#include "graph/graph.h"
#include "graph/op_registry.h"
#include "lower/plan_file.h"
#include "models/model.h"
#include "planner/policy.h"

namespace loom {

namespace launch {
struct Extensions;
}  // namespace launch
namespace plan {
struct PlanChoice;
}  // namespace plan
namespace runtime {
class Trainer;
}  // namespace runtime

// What one optimizer step did (the same figures as metrics.jsonl).
struct StepStats {
  int64_t step = 0;  // 1-based
  double loss = 0;   // mean token loss over the global batch
  double lr = 0;
  double grad_norm = 0;  // before clipping
  double step_time_s = 0;
  double tokens_per_s = 0;
  int64_t peak_mem_bytes = 0;  // most live CPU tensor bytes of this process during the step
  // Validation (eval.every): whether this step validated, and the mean token loss of the
  // validation batches through the plan's forward.
  bool has_val = false;
  double val_loss = 0;
};

// Builds the single-device graph of one micro-batch across all data-parallel replicas
// (shape.samples: batch.micro x parallel.dp, as the plan decides them). loom feeds int64 inputs
// named "tokens" and "targets" ([samples, seq]) and reads the vocabulary size from the first
// "embedding" op's table.
using GraphShape = models::GraphShape;
using ModelBuilder = models::ModelBuilder;

// User additions to loom's built-in ops, kernels and policies. Copies share nothing.
class Setup {
 public:
  Setup();
  Setup(const Setup& other);
  Setup& operator=(const Setup& other);
  ~Setup();

  // A new op type: its annotation decides every split loom may make of it.
  Status add_op(graph::OpSchema schema);
  // A parallel policy, chosen with parallel.policy=NAME.
  Status add_policy(const std::string& name, planner::Policy policy);
  // A model family selected with model.type=NAME, next to loom's zoo (gpt, swin, evoformer):
  // `check_parallel` may refuse a split (as the plan makes it) the model cannot take, naming the
  // key (empty: any the policy accepts).
  Status add_model(
      const std::string& name, ModelBuilder builder,
      std::function<Status(const Config&, const planner::SpaceSpec&)> check_parallel = {});
  // Replaces the model zoo (model.type) with `builder`.
  void set_model(ModelBuilder builder);

  const graph::OpRegistry& ops() const;
  const planner::PolicyRegistry& policies() const;
  // For loom/kernel.h and the trainer.
  launch::Extensions& extensions();
  std::shared_ptr<const launch::Extensions> shared() const;

 private:
  std::shared_ptr<launch::Extensions> ext_;
};

// Plans `config` for parallel.dp x tp x pp ranks without processes or LibTorch (the
// auto-planner's choice under parallel.policy auto): the planned graph, every rank's program and
// the schedule, as `loom plan` writes to plan.json.
Result<lower::PlanFile> make_plan(const Config& config, const Setup& setup = {});
// Writes DIR/plan.json and DIR/programs/rank_K.txt.
Status write_plan(const lower::PlanFile& plan, const std::string& dir);

class Trainer {
 public:
  static Result<std::unique_ptr<Trainer>> from_file(const std::string& config_path,
                                                    const std::vector<std::string>& overrides = {},
                                                    const Setup& setup = {});
  static Result<std::unique_ptr<Trainer>> create(const Config& config, const Setup& setup = {});
  ~Trainer();

  // One optimizer step over batch.global samples; then the step hooks run.
  Result<StepStats> step();
  // Steps until run.steps steps are done (or `steps` more when given).
  Status fit(int64_t steps = -1);
  // Called after every step with its figures, in the order added.
  void on_step(std::function<void(const StepStats&)> hook);

  // The plan this trainer runs (what every rank runs).
  const lower::PlanFile& plan() const;
  // The plan dump `loom plan` writes, into `dir`: every rank's program, plan.json, the schedule
  // files and the estimate per rank (summary.txt, summary.json).
  Status dump_plan(const std::string& dir) const;

  int64_t rank() const;        // 0 in single-process runs
  int64_t world_size() const;  // parallel.dp x tp x pp
  int64_t steps_done() const;
  const Config& config() const;

 private:
  Trainer(std::unique_ptr<runtime::Trainer> impl, Setup setup,
          std::shared_ptr<const plan::PlanChoice> plan);
  std::unique_ptr<runtime::Trainer> impl_;
  Setup setup_;
  std::shared_ptr<const plan::PlanChoice> plan_;  // the plan impl_ runs, and its config
  std::vector<std::function<void(const StepStats&)>> hooks_;
};

}  // namespace loom
