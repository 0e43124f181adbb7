// The training loop of one rank: the plan, its executor, data, optimizer and LR schedule.
// The header is LibTorch-free so command-line code compiles fast.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "checkpoint/hf_names.h"
#include "core/config.h"
#include "core/result.h"
#include "core/run_spec.h"
#include "graph/graph.h"
#include "lower/plan_file.h"
#include "observe/trace.h"

namespace loom::comm {
class Comm;
}  // namespace loom::comm
namespace loom::runtime {

class Executor;
class KernelRegistry;

// The key of the errors that stop a run for a non-finite loss, gradient or state: the run
// diverged (exit code 1), the input was valid.
constexpr const char* kNonFiniteKey = "non-finite";

// What the runtime receives of a plan: the runtime runs plans, it never makes them (plan/plan.h
// does; launch/planned_trainer.h joins the two).
struct RunPlan {
  graph::Graph model;    // the single-device graph the plan was made from
  lower::PlanFile file;  // the planned graph and every rank's program
  // The plan's estimate, what a traced step is read against, and its largest peak per rank
  // (bytes), what the run is refused by when the device holds less; empty and 0 for a plan read
  // from plan.json, which brings no estimate.
  observe::EstimateFigures estimate;
  double peak_bytes = 0;
  int64_t items_per_sample = 1;  // the throughput unit: tokens (GPT), images (Swin)
  // From the run's PlanSpec, so that the runtime reads none of the keys it parses (parallel.*,
  // batch.*, run.device, run.precision, comm.backend, comm.bucket_mb, optimizer.type).
  int64_t zero = 0;                          // 0, 1 (optimizer state sharded) or 3
  int64_t bucket_bytes = int64_t{25} << 20;  // a gradient bucket's most bytes
  int64_t global_batch = 8;                  // samples per optimizer step
  Device device = Device::kCpu;
  Precision precision = Precision::kFp32;
  CommBackend backend = CommBackend::kAuto;  // as asked (comm::make_comm resolves auto)
  OptimizerKind optimizer = OptimizerKind::kAdamw;
  HfNameMap hf_names;     // the model type's (checkpoint.init_from of a Hugging Face folder)
  std::string degrees;    // as messages name them: "parallel.dp (2) x parallel.tp (2) x ..."
  std::string plan_name;  // as checkpoints record it: "dp2 x tp2 x pp1"
};

struct StepStats {
  int64_t step = 0;  // 1-based index of the step just taken
  double loss = 0;   // mean token loss over the global batch (auxiliary losses included)
  // A mixture of experts' load-balancing loss (its share of `loss`), averaged like it.
  double moe_aux_loss = 0;
  bool has_moe_aux = false;  // whether the model has one
  // The busiest expert's tokens over the mean (1: balanced), averaged over layers and
  // micro-batches.
  double moe_max_load = 0;
  double lr = 0;
  double grad_norm = 0;  // before clipping
  double step_time_s = 0;
  // Of step_time_s, the seconds spent reading the step's samples (data.*).
  double data_time_s = 0;
  double tokens_per_s =
      0;  // items per second: tokens (GPT), images (Swin); see RunPlan::items_per_sample
  // Most live tensor bytes of this process's device during the step (the CUDA caching
  // allocator's peak on a GPU, the counting allocator's on the CPU).
  int64_t peak_mem_bytes = 0;
  // Validation (eval.every): after this step's update, the mean token loss of eval.steps global
  // batches of validation samples through the plan's forward (auxiliary losses excluded), and
  // the seconds it took (not counted in step_time_s).
  bool has_val = false;
  double val_loss = 0;
  double val_time_s = 0;
  // A traced step (logging.trace_steps), on rank 0: where its trace_step_N.json is and what it
  // measured against the plan's estimate (observe::summary_line); else empty.
  std::string trace_summary;
  // Whether this step's checkpoint is saved (checkpoint.every divides it, it is run.steps, or
  // the run stops after it), after the step recorder ran.
  bool checkpointed = false;
  // SIGTERM or SIGINT asked the run to stop (runtime/stop_signal.h): the signal this rank got
  // (SIGTERM when only another rank got one), else 0. The run stops after this step.
  int stop_signal = 0;
};

// Called by Trainer::step with the step's stats before the step's checkpoint is saved, so that
// what it writes (a metrics row) is durable when the checkpoint commits. Its error stops the
// step, the checkpoint unsaved.
using StepRecorder = std::function<Status(const StepStats&)>;

class Trainer {
 public:
  // Runs `plan`, made of `config`: builds the data, materialises this rank's parameters and
  // optimizer. The trainer is one rank of the plan and runs its program over `world`: by default
  // a one-rank Comm when the plan has one rank, else the Comm made from comm.* and the launcher's
  // environment. `kernels`: the op types' kernels (null: loom's built-ins). Every user mistake
  // (config, data file, a world of the wrong size) is returned as an error naming the key or
  // file.
  static Result<std::unique_ptr<Trainer>> create(const Config& config, RunPlan plan,
                                                 std::shared_ptr<comm::Comm> world = nullptr,
                                                 const KernelRegistry* kernels = nullptr);
  ~Trainer();

  // Runs one optimizer step over batch.global samples, then validates when eval.every divides
  // the step or it is the run's last (run.steps), then saves a checkpoint when StepStats says.
  // A non-finite loss or gradient norm stops it before the optimizer applies the gradients:
  // the error (key kNonFiniteKey) names the step and the first
  // non-finite parameter or gradient of this rank.
  Result<StepStats> step();
  // What step() calls before each checkpoint (rank 0 of `loom train`: the metrics row).
  void set_step_recorder(StepRecorder recorder);
  // The validation loss now: eval.steps global batches of validation samples through the
  // plan's forward alone. Fails when the run has no validation data (eval.every is 0).
  Result<double> validate();

  int64_t steps_done() const;
  // The checkpoint checkpoint.resume loaded (a step directory or a merged file); empty when the
  // run started from step 0.
  const std::string& resumed_from() const;
  const Config& config() const;
  const graph::Graph& graph() const;
  Executor& executor();  // this rank's
  int64_t rank() const;

  struct Impl;  // opaque; public so the checkpoint glue in trainer.cc can reach it

 private:
  // Applies checkpoint.resume and makes the trainer.
  static Result<std::unique_ptr<Trainer>> resume(std::unique_ptr<Impl> impl);
  explicit Trainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::runtime
