#include "runtime/trainer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "comm/local_comm.h"
#include "comm/make_comm.h"
#include "core/durable_file.h"
#include "core/log.h"
#include "core/run_spec.h"
#include "core/strings.h"
#include "graph/ops_moe.h"
#include "lower/backward_comm.h"
#include "lower/plan_file.h"
#include "lower/program.h"
#include "runtime/checkpoint.h"
#include "runtime/checkpoint_writer.h"
#include "runtime/debug_env.h"
#include "runtime/device.h"
#include "runtime/executor.h"
#include "runtime/hf_weights.h"
#include "runtime/inputs.h"
#include "runtime/lr_schedule.h"
#include "runtime/memory.h"
#include "runtime/optimizer.h"
#include "runtime/rank_agreement.h"
#include "runtime/step_trace.h"
#include "runtime/stop_signal.h"

namespace loom::runtime {

struct Trainer::Impl {
  Config config;
  KernelRegistry kernels = KernelRegistry::with_builtin_kernels();
  graph::Graph graph;    // the model, on one device
  graph::Graph planned;  // the plan's graph: every op on a rank and a stage
  lower::Lowered lowered;
  std::shared_ptr<comm::Comm> world;
  RunDevice device;
  std::unique_ptr<Executor> executor;
  std::unique_ptr<InputFeeder> inputs;
  std::unique_ptr<Optimizer> optimizer;
  int64_t items_per_sample = 1;  // throughput unit: tokens (GPT), images (Swin)
  int64_t samples_per_step = 8;  // RunPlan::global_batch (batch.global)
  HfNameMap hf_names;            // RunPlan::hf_names
  // LOOM_PROFILE_STEP (core/debug_env.h), read once: the step LibTorch's profiler records.
  int64_t profile_step = debug_env_int("LOOM_PROFILE_STEP", 0);
  int64_t step = 0;
  std::string resumed_from;  // the checkpoint checkpoint.resume loaded, if any
  // logging.trace_steps: the traced step's recording (null in other steps), and the plan's
  // estimate its summary reads the measurement against (empty for a plan from plan.json).
  std::unique_ptr<observe::Tracer> tracer;
  observe::EstimateFigures estimate;
  StepRecorder recorder;  // called before each checkpoint (set_step_recorder)
  // Rank 0's claim on checkpoint.dir (checkpoint_dir.h): taken at the start when the directory
  // exists, else at the first checkpoint, so that a run that never saves writes nothing there.
  std::unique_ptr<CheckpointDir> checkpoint_dir;
  std::string plan_name;  // RunPlan::plan_name, for the checkpoints' manifests
  // checkpoint.async: the write in flight. Declared last, so that it finishes before the rest goes.
  std::unique_ptr<CheckpointWriter> writer;
};

namespace {

// logging.trace_steps: a Tracer for step `step` (1-based) when it is traced, else null.
std::unique_ptr<observe::Tracer> tracer_for(const Config& config, const RunDevice& device,
                                            int64_t step) {
  const std::vector<int64_t>& traced = config.logging.trace_steps;
  if (std::find(traced.begin(), traced.end(), step) == traced.end()) return nullptr;
  auto tracer = std::make_unique<observe::Tracer>();
  if (device.cuda()) tracer->set_sync([device] { synchronize_device(device); });
  return tracer;
}

// The pieces, values and optimizer a checkpoint saves and loads.
CheckpointTarget checkpoint_target(Trainer::Impl& s) {
  CheckpointTarget t;
  t.optimizer = s.optimizer.get();
  t.graph = &s.planned;
  t.pieces = s.executor->parameter_pieces();
  t.params = s.executor->parameters();
  t.world = s.world.get();
  t.rank = s.world->world_rank().value();
  t.world_size = s.world->size();
  t.plan_name = s.plan_name;
  t.global_batch = s.samples_per_step;
  return t;
}

Status claim_checkpoint_dir(Trainer::Impl& s, bool only_if_exists) {
  if (s.checkpoint_dir || s.config.checkpoint.every == 0 || s.world->world_rank().value() != 0)
    return Status::success();
  std::error_code ec;
  if (only_if_exists && !std::filesystem::exists(checkpoint_root(s.config), ec))
    return Status::success();
  LOOM_ASSIGN_OR_RETURN(s.checkpoint_dir, CheckpointDir::claim(s.config, s.resumed_from));
  return Status::success();
}

// The first non-finite parameter (a diverged or damaged start) or gradient of this rank, or ""
// when it holds none: looked for only once the step's sums were found non-finite.
std::string first_non_finite(const Trainer::Impl& s) {
  const std::vector<at::Tensor>& params = s.executor->parameters();
  const auto& pieces = s.executor->parameter_pieces();
  auto name = [&](size_t i) { return "'" + s.planned.tensor(pieces[i].tensor).name + "'"; };
  for (size_t i = 0; i < params.size(); ++i)
    if (!at::isfinite(params[i]).all().item<bool>()) return "parameter " + name(i);
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = params[i].grad();
    if (g.defined() && !at::isfinite(g).all().item<bool>()) return "the gradient of " + name(i);
  }
  return "";
}

Error non_finite_step(const Trainer::Impl& s, double loss, double norm, int64_t rank) {
  auto text = [](double v) {
    std::ostringstream os;
    if (std::isnan(v))
      os << "nan";
    else
      os << v;
    return os.str();
  };
  const std::string first = first_non_finite(s);
  std::ostringstream os;
  os << "step " << s.step + 1 << ": the loss is " << text(loss) << " and the gradient norm "
     << text(norm) << "; the first non-finite tensor of rank " << rank << ": "
     << (first.empty() ? "none (another rank holds it)" : first)
     << ". The run stops before the optimizer applies the step (lower optimizer.lr, or check the "
        "data and checkpoint.init_from); no checkpoint holds its values";
  return Error::at(kNonFiniteKey, os.str());
}

// LOOM_PROFILE_STEP=N: LibTorch's profiler records step N's ops (times, shapes) as a chrome
// trace in the run's output directory. It records into memory, and the file is written after the
// step by finish_profile: RecordProfile's own file would drop a failed write without a word.
struct StepProfile {
  std::filesystem::path file;
  std::ostringstream json;
  // Declared after `json`, which it writes into when it ends.
  std::unique_ptr<torch::autograd::profiler::RecordProfile> record;
};

std::unique_ptr<StepProfile> start_profile(const Config& config, int64_t step, int64_t rank) {
  auto p = std::make_unique<StepProfile>();
  p->file = std::filesystem::path(config.run.output_dir) /
            ("profile_step_" + std::to_string(step) + "_rank_" + std::to_string(rank) + ".json");
  p->record = std::make_unique<torch::autograd::profiler::RecordProfile>(p->json);
  return p;
}

Status finish_profile(std::unique_ptr<StepProfile> p) {
  p->record.reset();
  std::error_code ec;
  std::filesystem::create_directories(p->file.parent_path(), ec);
  if (Status s = write_file_atomically(p->file, p->json.str()); !s.ok())
    return Error::at(p->file.string(), "LOOM_PROFILE_STEP: " + s.error().message);
  return Status::success();
}

// The micro-batches of the global batch whose first sample is `first_sample`. Every rank reads
// each whole micro-batch (cheap) and cuts the pieces its ops read.
Result<std::vector<std::unordered_map<int64_t, at::Tensor>>> global_batch(Trainer::Impl& s,
                                                                          int64_t first_sample,
                                                                          bool validation) {
  std::vector<std::unordered_map<int64_t, at::Tensor>> inputs;
  for (int64_t m = 0; m < s.config.micro_batches(); ++m) {
    LOOM_ASSIGN_OR_RETURN(auto in,
                          s.inputs->micro_batch(first_sample + m * s.inputs->rows(), validation));
    inputs.push_back(std::move(in));
  }
  return inputs;
}

}  // namespace

// checkpoint.resume: continues from the step a checkpoint was saved at.
Result<std::unique_ptr<Trainer>> Trainer::resume(std::unique_ptr<Impl> impl) {
  LOOM_ASSIGN_OR_RETURN(auto path, resume_path(impl->config));
  if (!path.empty()) {
    LOOM_ASSIGN_OR_RETURN(impl->step,
                          load_checkpoint(checkpoint_target(*impl), impl->config, path));
    impl->resumed_from = path.string();
  } else if (!impl->config.checkpoint.init_from.empty()) {
    // A fine-tuning run starts from the folder's weights and fresh optimizer state at step 0.
    LOOM_TRY(load_hf_weights(checkpoint_target(*impl), impl->config, impl->hf_names,
                             impl->config.checkpoint.init_from));
  }
  LOOM_TRY(claim_checkpoint_dir(*impl, /*only_if_exists=*/true));
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

namespace {

// A plan whose estimated peak exceeds the memory a rank has (the GPU's, or the machine's shared
// by its ranks) is refused before anything is allocated, naming what sized it. Every process
// decides alike, before the rendezvous.
Status check_fits(const Config& config, const RunPlan& plan, const RunDevice& device,
                  const comm::EnvLookup& env) {
  const double peak = plan.peak_bytes;
  if (!(peak > 0)) return Status::success();  // a plan.json brings no estimate
  auto count = [&](const char* name) -> int64_t {
    const auto v = env(name);
    if (!v) return 0;
    char* end = nullptr;
    const long long n = std::strtoll(v->c_str(), &end, 10);
    return end && *end == '\0' && n > 0 ? n : 0;
  };
  const int64_t local =
      std::max<int64_t>(1, count("LOCAL_WORLD_SIZE") ? count("LOCAL_WORLD_SIZE")
                                                     : count("OMPI_COMM_WORLD_LOCAL_SIZE"));
  const double memory = device_memory_bytes(device, local);
  if (!(memory > 0) || peak <= memory) return Status::success();
  std::string sizes, first_key = "model.preset";
  for (const auto& [name, value] : config.model.args) {
    if (sizes.empty()) first_key = "model.args." + name;
    sizes += (sizes.empty() ? "" : ", ") + name + "=" + value;
  }
  return config.error(
      first_key, "the plan's estimated peak memory per rank, " + human_bytes(peak) +
                     ", exceeds what a rank has here, " + human_bytes(memory) + " (" +
                     (device.cuda() ? std::string("the GPU's")
                                    : "the machine's, over " + std::to_string(local) + " ranks") +
                     "): model " + config.model.type + " " + config.model.preset +
                     (sizes.empty() ? std::string() : " with " + sizes) + " on " + plan.degrees +
                     "; make the model smaller or split it over more ranks (loom plan shows the "
                     "estimate per rank)");
}

// The local backend runs the ranks as threads of one process. On a GPU, LibTorch's autograd runs
// the backward passes of all of them on its one thread per device: a rank waiting there for
// another rank's part of an exchange waits for a rank whose backward cannot start until it
// returns. Such plans are refused before step 1 rather than stopped by the timeout.
Status check_thread_ranks(const Config& config, const comm::Comm& world, const RunDevice& device,
                          const graph::Graph& planned, const lower::Lowered& lowered) {
  const auto backend = parse_backend(world.backend_name());
  if (world.size() < 2 || !device.cuda() || !backend.ok() || *backend != CommBackend::kLocal)
    return Status::success();
  const auto exchange = lower::exchange_in_backward(planned, lowered);
  if (!exchange) return Status::success();
  return config.error(
      "run.device",
      "cuda with the ranks as threads of one process (the local backend): " + *exchange +
          " runs inside the backward pass, which LibTorch runs for every thread on one thread "
          "per GPU, so the ranks would wait for each other until the timeout; run the ranks as "
          "processes (loomrun, comm.backend nccl, a GPU each), or this plan on the CPU");
}

}  // namespace

Result<std::unique_ptr<Trainer>> Trainer::create(const Config& config, RunPlan plan,
                                                 std::shared_ptr<comm::Comm> world,
                                                 const KernelRegistry* kernels) {
  track_cpu_memory();  // before any parameter exists, so every live byte is counted
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  if (kernels) impl->kernels = *kernels;
  impl->graph = std::move(plan.model);
  impl->estimate = std::move(plan.estimate);
  impl->items_per_sample = plan.items_per_sample;
  impl->plan_name = plan.plan_name;
  impl->samples_per_step = plan.global_batch;
  impl->hf_names = plan.hf_names;
  LOOM_ASSIGN_OR_RETURN(impl->inputs, InputFeeder::create(config, impl->graph));

  // The device first: a run on a GPU that is not there stops before any rendezvous.
  const comm::EnvLookup env = comm::process_env();
  Result<RunDevice> device =
      select_device(DeviceRequest::of(config, plan.device, plan.precision), comm::local_rank(env));
  if (!device.ok()) return config.locate(device.error());
  impl->device = *device;
  const int64_t world_size = plan.file.world_size;
  LOOM_TRY(check_fits(config, plan, impl->device, env));
  if (!world && world_size == 1) {
    // One process alone: a plan of one rank over a one-rank Comm.
    world = comm::LocalWorld(1, config.comm.timeout_s).comm(Rank(0));
  } else if (!world) {
    // A worker process among others on this machine takes its share of the cores.
    comm::configure_worker_threads();
    LOOM_ASSIGN_OR_RETURN(world, comm::make_comm(config.comm, env, impl->device.cuda()));
  }
  if (world->size() != world_size && plan.backend == CommBackend::kMpi && world->size() == 1 &&
      !env("OMPI_COMM_WORLD_SIZE") && !env("PMI_SIZE") && env("WORLD_SIZE"))
    return config.error("comm.backend",
                        "comm.backend mpi takes its " + std::to_string(world_size) +
                            " ranks from mpirun (or srun), but this process was started by "
                            "loomrun or torchrun (WORLD_SIZE " +
                            env("WORLD_SIZE").value_or("?") + "); start it with mpirun -np " +
                            std::to_string(world_size) +
                            ", or use comm.backend gloo (nccl on GPUs) under loomrun");
  if (world->size() != world_size)
    return config.error("parallel.dp", plan.degrees + " = " + std::to_string(world_size) +
                                           " ranks, but " + std::to_string(world->size()) +
                                           " processes were started");
  LOOM_TRY(check_ranks_agree(*world, impl->device,
                             facts_of(config, plan.file.hash + "/" + plan.file.model_digest)));
  impl->world = world;
  impl->planned = std::move(plan.file.graph);
  impl->lowered = std::move(plan.file.lowered);
  LOOM_TRY(check_thread_ranks(config, *world, impl->device, impl->planned, impl->lowered));
  LOOM_ASSIGN_OR_RETURN(
      impl->executor,
      Executor::create(impl->planned, impl->lowered, world, impl->kernels,
                       ExecutorOptions{static_cast<uint64_t>(config.run.seed), impl->device,
                                       plan.bucket_bytes, plan.zero == 1,
                                       /*seeded_init=*/config.checkpoint.init_from.empty()}));
  // Each rank reads only the samples its ops read (none on a middle pipeline stage).
  impl->inputs->read_only(impl->executor->input_rows());
  // Weight decay applies to matrices, not to biases and norm scales.
  std::vector<bool> decay;
  for (const auto& piece : impl->executor->parameter_pieces())
    decay.push_back(impl->planned.tensor(piece.tensor).shape.size() >= 2);
  impl->optimizer =
      std::make_unique<Optimizer>(plan.optimizer, config.optimizer, impl->executor->parameters(),
                                  std::move(decay), impl->executor->parameter_owned());
  return resume(std::move(impl));
}

namespace {

// The step's figures once the optimizer applied it.
StepStats stats_of(const Trainer::Impl& s, const StepSums& sums, double scale, double lr,
                   double norm, std::chrono::steady_clock::time_point start, double data_time_s) {
  StepStats st;
  st.step = s.step;
  st.loss = sums.loss * scale;
  st.moe_aux_loss = sums.aux_loss * scale;
  st.moe_max_load = sums.max_expert_load;
  st.has_moe_aux = std::any_of(s.graph.ops().begin(), s.graph.ops().end(),
                               [](const graph::Op& op) { return op.type() == graph::kMoeAuxLoss; });
  st.lr = lr;
  st.grad_norm = norm;
  st.step_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  st.data_time_s = data_time_s;
  st.tokens_per_s = static_cast<double>(s.samples_per_step * s.items_per_sample) / st.step_time_s;
  st.peak_mem_bytes = peak_device_bytes(s.device);
  return st;
}

// checkpoint.async: waits for the previous write, saying so when the training had to.
Status await_previous_write(Trainer::Impl& s) {
  if (!s.writer || !s.writer->in_flight()) return Status::success();
  const bool had_to_wait = !s.writer->finished();
  const auto start = std::chrono::steady_clock::now();
  Status done = s.writer->wait();
  if (had_to_wait) {
    std::ostringstream os;
    os << "checkpoint of step " << s.step << " waited "
       << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
       << " s for the write of step " << s.writer->step()
       << " (checkpoint.async writes one at a time; checkpoint.every steps took less than a write)";
    log_warning(os.str());
  }
  return done;
}

// This step's checkpoint: written now, or with checkpoint.async copied now and written in the
// background. The last one of a run (its last step, or a stop signal) is written before the run
// ends.
Status save(Trainer::Impl& s, bool last) {
  LOOM_TRY(claim_checkpoint_dir(s, /*only_if_exists=*/false));
  const std::filesystem::path root = checkpoint_root(s.config);
  if (!s.config.checkpoint.async)
    return save_checkpoint(checkpoint_target(s), s.config, s.step, root);
  LOOM_TRY(await_previous_write(s));
  LOOM_ASSIGN_OR_RETURN(
      PendingCheckpoint pending,
      snapshot_checkpoint(checkpoint_target(s), s.config, s.step, root,
                          s.writer ? s.writer->take_buffer() : SafeTensorsWriter()));
  if (!s.writer) {
    const auto timeout =
        std::chrono::milliseconds(static_cast<int64_t>(s.config.comm.timeout_s * 1000));
    s.writer = std::make_unique<CheckpointWriter>(timeout);
  }
  s.writer->start(std::move(pending));
  return last ? s.writer->wait() : Status::success();
}

// The step's record, then its checkpoint: every checkpoint.every steps, after the last step, and
// after the step a stop signal ended.
Result<StepStats> finish_step(Trainer::Impl& s, StepStats st, bool stop) {
  if (stop) st.stop_signal = stop_signal() != 0 ? stop_signal() : SIGTERM;
  const int64_t every = s.config.checkpoint.every;
  const bool last = s.step == s.config.run.steps || stop;
  st.checkpointed = every > 0 && (s.step % every == 0 || last);
  if (s.recorder) LOOM_TRY(s.recorder(st));
  if (st.checkpointed) LOOM_TRY(save(s, last));
  return st;
}

}  // namespace

Result<StepStats> Trainer::step() {
  Impl& s = *impl_;
  Result<StepStats> done = [&]() -> Result<StepStats> {
    maybe_hold_for_stop();
    std::unique_ptr<StepProfile> profile =
        s.profile_step == s.step + 1 ? start_profile(s.config, s.step + 1, rank()) : nullptr;
    s.tracer = tracer_for(s.config, s.device, s.step + 1);
    s.executor->set_tracer(s.tracer.get());
    auto start = std::chrono::steady_clock::now();
    reset_peak_device_bytes(s.device);
    const int64_t micro = s.config.micro_batches();
    const int64_t first_sample = s.step * s.samples_per_step;
    LOOM_ASSIGN_OR_RETURN(auto inputs, global_batch(s, first_sample, /*validation=*/false));
    const double data_time_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    const double scale = 1.0 / static_cast<double>(micro);
    LOOM_ASSIGN_OR_RETURN(StepSums sums, s.executor->run(inputs, scale, stop_signal() != 0));
    const double norm = std::sqrt(sums.grad_norm_squared);
    // The loss and the norm are on the host already: a non-finite one costs nothing more to see.
    if (!std::isfinite(sums.loss) || !std::isfinite(norm))
      return non_finite_step(s, sums.loss * scale, norm, rank());
    maybe_kill_at_step(s.step + 1, rank());
    clip_gradients(s.executor->parameters(), norm, s.config.optimizer.clip_grad_norm);
    const double lr = lr_at(s.config.optimizer, s.step, s.config.run.steps);
    s.optimizer->step(lr);
    LOOM_TRY(s.executor->gather_parameters());
    ++s.step;

    StepStats st = stats_of(s, sums, scale, lr, norm, start, data_time_s);
    if (s.tracer) {
      s.executor->set_tracer(nullptr);
      LOOM_ASSIGN_OR_RETURN(st.trace_summary,
                            finish_step_trace(*s.tracer, *s.world, s.device, s.step,
                                              s.config.run.output_dir, s.estimate));
    }
    if (profile) LOOM_TRY(finish_profile(std::move(profile)));
    const int64_t every = s.config.eval.every;
    if (every > 0 && (s.step % every == 0 || s.step == s.config.run.steps)) {
      const auto eval_start = std::chrono::steady_clock::now();
      LOOM_ASSIGN_OR_RETURN(st.val_loss, validate());
      st.has_val = true;
      st.val_time_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - eval_start).count();
    }
    return finish_step(s, std::move(st), sums.stop_requested);
  }();
  // A failed step ends the run: a background write must not wait for ranks that may be gone.
  // A non-finite step stops every rank together, alive: their writes of the last good state end.
  if (!done.ok() && done.error().key != kNonFiniteKey && s.writer) s.writer->cancel();
  return done;
}

void Trainer::set_step_recorder(StepRecorder recorder) { impl_->recorder = std::move(recorder); }

Result<double> Trainer::validate() {
  Impl& s = *impl_;
  if (!s.inputs->has_validation())
    return s.config.error("eval.every", "the run has no validation (eval.every is 0)");
  // The same batches every time, so validation losses of different steps compare.
  double total = 0;
  for (int64_t b = 0; b < s.config.eval.steps; ++b) {
    LOOM_ASSIGN_OR_RETURN(auto inputs,
                          global_batch(s, b * s.samples_per_step, /*validation=*/true));
    LOOM_ASSIGN_OR_RETURN(StepSums sums, s.executor->evaluate(inputs));
    total += (sums.loss - sums.aux_loss) / static_cast<double>(inputs.size());
  }
  return total / static_cast<double>(s.config.eval.steps);
}

int64_t Trainer::steps_done() const { return impl_->step; }
const std::string& Trainer::resumed_from() const { return impl_->resumed_from; }
const Config& Trainer::config() const { return impl_->config; }
const graph::Graph& Trainer::graph() const { return impl_->graph; }
Executor& Trainer::executor() { return *impl_->executor; }
int64_t Trainer::rank() const { return impl_->world->world_rank().value(); }

}  // namespace loom::runtime
