// loom train CONFIG [key=value ...]: validates everything, then creates the run directory and
// locks it for this run, writes the resolved config, trains, and appends one JSON line per step
// to metrics.jsonl (and the same values as TensorBoard scalars under logging.tensorboard). A
// write that fails stops the run naming the file.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/durable_file.h"
#include "core/log.h"
#include "launch/cli_parse.h"
#include "launch/command.h"
#include "launch/config_file.h"
#include "observe/event_file.h"

#if LOOM_HAVE_RUNTIME
#include "launch/planned_trainer.h"
#include "lower/plan_file.h"
#include "models/model.h"
#include "runtime/checkpoint.h"
#include "runtime/checkpoint_dir.h"
#include "runtime/metrics_file.h"
#include "runtime/run_lock.h"
#include "runtime/stop_signal.h"
#include "runtime/trainer.h"
#endif

namespace loom::cli {
namespace {

int bad_input(const std::string& message) {
  std::fprintf(stderr, "loom train: error: %s\n", message.c_str());
  return kExitBadInput;
}

[[maybe_unused]] std::string format_duration(double seconds) {
  long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

[[maybe_unused]] std::string format_rate(double per_s) {
  char buf[32];
  if (per_s >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", per_s / 1e6);
  else if (per_s >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", per_s / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", per_s);
  return buf;
}

// The TensorBoard scalars of a step: every number of its metrics.jsonl line but the step, under
// the line's own key, so the two never disagree.
[[maybe_unused]] std::vector<std::pair<std::string, double>> scalars_of(
    const nlohmann::json& line) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [key, value] : line.items())
    if (key != "step" && value.is_number()) out.emplace_back(key, value.get<double>());
  return out;
}

[[maybe_unused]] double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

#if LOOM_HAVE_RUNTIME
namespace fs = std::filesystem;

// What a throughput figure of the config's model type counts (tokens, images), from the zoo.
Result<models::SampleItems> sample_items(const Config& config) {
  const models::ModelRegistry zoo = models::ModelRegistry::with_builtin_models();
  LOOM_ASSIGN_OR_RETURN(const models::ModelType* type, zoo.of(config));
  return type->items ? type->items(config) : models::SampleItems{};
}

// What rank 0 writes into the run directory, held open for the whole run.
struct RunOutput {
  std::unique_ptr<runtime::RunDirLock> lock;  // first: nothing is written without it
  std::unique_ptr<observe::EventFileWriter> tensorboard;
  std::unique_ptr<runtime::MetricsFile> metrics;
};

// The event file (logging.tensorboard) first, so that one that cannot be written leaves no run
// directory behind; then the directory, locked for this run, then its config.yaml and
// metrics.jsonl (a resumed run keeps the rows of the steps it resumes after). Errors are the
// user's: they name the key or file.
Result<RunOutput> open_run_output(const Config& config, int64_t resumed_at) {
  RunOutput out;
  if (!config.logging.tensorboard.empty()) {
    auto opened = observe::EventFileWriter::open(config.logging.tensorboard);
    if (!opened.ok()) return config.error("logging.tensorboard", opened.error().message);
    out.tensorboard = std::move(*opened);
  }
  const fs::path run_dir = config.run.output_dir;
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec)
    return Error::at("run.output_dir",
                     "run.output_dir: cannot create '" + run_dir.string() + "': " + ec.message());
  auto refuse = [&](const std::string& message) {
    // The refused run leaves no trace: not even the empty event file it just made.
    if (out.tensorboard) {
      const fs::path events = out.tensorboard->path();
      out.tensorboard.reset();
      fs::remove(events, ec);
    }
    return config.error("run.output_dir", message);
  };
  auto lock = runtime::RunDirLock::acquire(run_dir);
  if (!lock.ok()) return refuse(lock.error().message);
  out.lock = std::move(*lock);
  // checkpoint.resume latest with no checkpoint yet continues the run there from step 0.
  if (config.checkpoint.resume == "none" && runtime::holds_run(run_dir)) {
    if (!config.run.overwrite)
      return refuse("run.output_dir '" + run_dir.string() +
                    "' holds a run (its config.yaml, metrics.jsonl): a new run does not write over "
                    "it; resume it (checkpoint.resume=latest), set run.overwrite=true to clear it "
                    "and start over, or give this run another directory");
    std::vector<fs::path> keep;  // this run's own: its checkpoints claimed, its event file
    if (config.checkpoint.every > 0) keep.push_back(runtime::checkpoint_root(config));
    if (out.tensorboard) keep.push_back(out.tensorboard->path());
    LOOM_TRY(runtime::clear_run_dir(run_dir, keep));
  }
  LOOM_TRY(write_file_atomically(run_dir / "config.yaml", to_yaml(config)));
  const fs::path metrics = run_dir / "metrics.jsonl";
  LOOM_ASSIGN_OR_RETURN(out.metrics, resumed_at == 0
                                         ? runtime::MetricsFile::create(metrics)
                                         : runtime::MetricsFile::resume(metrics, resumed_at));
  return out;
}

// A step's metrics.jsonl row and TensorBoard scalars (with the ranks it ran on: an elastic
// restart changes them), the row durable before the step's checkpoint commits; a write that
// fails stops the run.
Status record_step(const Config& config, RunOutput& out, const runtime::StepStats& st,
                   int64_t world_size) {
  nlohmann::json line = {{"step", st.step},
                         {"world_size", world_size},
                         {"loss", st.loss},
                         {"lr", st.lr},
                         {"grad_norm", st.grad_norm},
                         {"step_time_s", st.step_time_s},
                         {"data_time_s", st.data_time_s},
                         {"tokens_per_s", st.tokens_per_s},
                         {"peak_mem_bytes", st.peak_mem_bytes}};
  if (st.has_moe_aux) {
    line["moe_aux_loss"] = st.moe_aux_loss;
    line["moe_max_load"] = st.moe_max_load;
  }
  if (st.has_val) {
    line["val_loss"] = st.val_loss;
    line["val_ppl"] = std::exp(st.val_loss);
  }
  LOOM_TRY(out.metrics->append(line.dump()));
  if (st.checkpointed) LOOM_TRY(out.metrics->sync());
  if (out.tensorboard)
    if (Status s = out.tensorboard->write_scalars(st.step, scalars_of(line), unix_seconds());
        !s.ok())
      return config.error("logging.tensorboard", s.error().message);
  return Status::success();
}

// Whatever is still buffered reaches the files now, so that a failure is reported.
Status close_run_output(const Config& config, RunOutput& out) {
  if (out.tensorboard)
    if (Status s = out.tensorboard->flush(); !s.ok())
      return config.error("logging.tensorboard", s.error().message);
  return out.metrics->close();
}

// Progress: a bar rewritten in place on a terminal, a line every logging.every steps otherwise.
void report_progress(const Config& config, const runtime::StepStats& st, double eta, bool tty,
                     const char* rate) {
  const int64_t total = config.run.steps;
  if (tty) {
    const int width = 24;
    int filled = static_cast<int>(width * st.step / total);
    std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
    std::printf("\r  step %lld/%lld [%s] loss %.4f  %s %s  ETA %s  ",
                static_cast<long long>(st.step), static_cast<long long>(total), bar.c_str(),
                st.loss, format_rate(st.tokens_per_s).c_str(), rate, format_duration(eta).c_str());
    if (st.has_val)
      std::printf("\n  step %lld/%lld val_loss %.4f val_ppl %.2f (%.1fs)\n",
                  static_cast<long long>(st.step), static_cast<long long>(total), st.val_loss,
                  std::exp(st.val_loss), st.val_time_s);
    std::fflush(stdout);
    return;
  }
  if (st.step % config.logging.every == 0 || st.step == total) {
    std::printf("step %lld/%lld loss %.6f lr %.3g grad_norm %.4f %s %s step_time %.3fs ETA %s\n",
                static_cast<long long>(st.step), static_cast<long long>(total), st.loss, st.lr,
                st.grad_norm, format_rate(st.tokens_per_s).c_str(), rate, st.step_time_s,
                format_duration(eta).c_str());
  }
  if (st.has_val)
    std::printf("step %lld/%lld val_loss %.6f val_ppl %.4f val_time %.3fs\n",
                static_cast<long long>(st.step), static_cast<long long>(total), st.val_loss,
                std::exp(st.val_loss), st.val_time_s);
  std::fflush(stdout);
}

// A run SIGTERM or SIGINT stopped (after its step's checkpoint) ends as that signal would.
int stopped(const runtime::StepStats& st, bool report) {
  if (report)
    std::printf(
        "loom: stopped by %s after step %lld%s\n", st.stop_signal == SIGINT ? "SIGINT" : "SIGTERM",
        static_cast<long long>(st.step),
        st.checkpointed ? ", its checkpoint saved" : " (checkpoint.every is 0: no checkpoint)");
  std::fflush(stdout);
  return 128 + st.stop_signal;
}

// Where a worker's start went: planning (0 for a plan file), then connecting the ranks,
// building the trainer and loading its checkpoint.
struct StartTimes {
  double plan_s = 0;
  double create_s = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Ranks other than 0 train silently; rank 0 reports and writes the run directory.
int train_follower(runtime::Trainer& trainer) {
  for (int64_t i = trainer.steps_done(); i < trainer.config().run.steps; ++i) {
    auto st = trainer.step();
    if (!st.ok()) {
      std::fprintf(stderr, "loom train: rank %lld: error: %s\n",
                   static_cast<long long>(trainer.rank()), st.error().message.c_str());
      return kExitFailure;
    }
    if (st->stop_signal) return stopped(*st, /*report=*/false);
  }
  return kExitOk;
}

// A checkpoint at or past run.steps leaves nothing to train: said, not reported as a run.
bool nothing_to_train(const runtime::Trainer& trainer) {
  const int64_t at = trainer.steps_done(), total = trainer.config().run.steps;
  if (at == 0 || at < total) return false;
  std::printf(
      "loom: nothing to train: the checkpoint %s is at step %lld, already at or past "
      "run.steps=%lld; raise run.steps to train on\n",
      trainer.resumed_from().c_str(), static_cast<long long>(at), static_cast<long long>(total));
  return true;
}

int train_lead(const Config& config, runtime::Trainer& trainer, const StartTimes& times) {
  if (nothing_to_train(trainer)) return kExitOk;
  // A checkpoint folder that cannot be written is found now, not after the steps before the
  // first checkpoint.
  if (config.checkpoint.every > 0) {
    const std::string key = config.checkpoint.dir.empty() ? "run.output_dir" : "checkpoint.dir";
    if (Status s = check_writable_dir(runtime::checkpoint_root(config).string(), key); !s.ok())
      return bad_input(config.error(key, s.error().message).message);
  }
  // Only now, with every input validated, does anything get written.
  const int64_t resumed_at = trainer.steps_done();
  auto opened = open_run_output(config, resumed_at);
  if (!opened.ok()) return bad_input(opened.error().message);
  RunOutput& out = *opened;

  const bool tty = isatty(STDOUT_FILENO);
  const int64_t total = config.run.steps;
  std::printf("loom: training %s (%s) for %lld steps, %lld micro-batches of %lld per step -> %s\n",
              config.model.type.c_str(), config.model.preset.c_str(), static_cast<long long>(total),
              static_cast<long long>(trainer.config().micro_batches()),
              static_cast<long long>(config.batch.micro), config.run.output_dir.c_str());
  if (resumed_at > 0)
    std::printf("loom: resumed from step %lld (%s)\n", static_cast<long long>(resumed_at),
                trainer.resumed_from().c_str());
  std::printf("loom: planned in %.2f s, trainer ready in %.2f s (ranks connected, %s)\n",
              times.plan_s, times.create_s,
              resumed_at > 0 ? "checkpoint loaded" : "parameters initialised");
  if (const int64_t dropped = out.metrics->dropped_rows(); dropped > 0)
    std::printf(
        "loom: dropped %lld row(s) after step %lld from %s: this run trains those steps "
        "again\n",
        static_cast<long long>(dropped), static_cast<long long>(resumed_at),
        out.metrics->path().string().c_str());
  std::fflush(stdout);
  double elapsed = 0, first_loss = 0, last_loss = 0;
  const auto items = sample_items(config);
  const char* rate = items.ok() ? items->rate_label.c_str() : "samples/s";
  // The row of a step is written before its checkpoint, inside step().
  trainer.set_step_recorder([&](const runtime::StepStats& st) {
    return record_step(config, out, st, trainer.config().parallel.world_size());
  });
  for (int64_t i = resumed_at; i < total; ++i) {
    auto st = trainer.step();
    if (!st.ok()) {
      if (tty) std::printf("\n");
      // Data and write errors are the user's; a communication failure or a diverged run is the
      // run's.
      if (st.error().key == "comm" || st.error().key == runtime::kNonFiniteKey) {
        std::fprintf(stderr, "loom train: rank 0: error: %s\n", st.error().message.c_str());
        return kExitFailure;
      }
      return bad_input(st.error().message);
    }
    elapsed += st->step_time_s;
    if (i == resumed_at) first_loss = st->loss;
    last_loss = st->loss;
    if (!st->trace_summary.empty()) {
      std::printf("%sloom: %s\n", tty ? "\n" : "", st->trace_summary.c_str());
      std::fflush(stdout);
    }
    const double eta =
        elapsed / static_cast<double>(i + 1 - resumed_at) * static_cast<double>(total - i - 1);
    report_progress(config, *st, eta, tty, rate);
    if (st->stop_signal) {
      if (Status s = close_run_output(config, out); !s.ok()) return bad_input(s.error().message);
      return stopped(*st, /*report=*/true);
    }
  }
  if (tty) std::printf("\n");
  if (Status s = close_run_output(config, out); !s.ok()) return bad_input(s.error().message);
  std::printf("loom: done: loss %.4f -> %.4f in %s; metrics in %s\n", first_loss, last_loss,
              format_duration(elapsed).c_str(), out.metrics->path().string().c_str());
  return kExitOk;
}
#endif

}  // namespace

int train_main(const Args& args) {
  CLI::App app{"Train a model from a YAML config. Trailing key=value arguments override keys.",
               "loom train"};
  std::string config_path;
  std::string plan_path;
  std::vector<std::string> overrides;
  app.add_option("config", config_path, "the run's YAML config")->required();
  app.add_option("overrides", overrides, "key=value overrides, e.g. run.steps=5 parallel.tp=2");
  app.add_option("--plan", plan_path,
                 "run the plan in this plan.json (from `loom plan`) instead of planning");
  if (auto code = parse_args(app, args, "train")) return *code;

  if (Status s = check_launcher_env(); !s.ok()) return bad_input(s.error().message);
  auto loaded = load_config_file(config_path, overrides);
  if (!loaded.ok()) return bad_input(loaded.error().message);
  const Config& config = *loaded;
  if (Status s = check_run_asks(config); !s.ok()) return bad_input(s.error().message);
  if (Status s = init_logging(-1, config.logging.level); !s.ok())
    return bad_input(s.error().message);

#if LOOM_HAVE_RUNTIME
  std::optional<lower::PlanFile> plan;
  if (!plan_path.empty()) {
    auto loaded_plan = lower::load_plan_file(plan_path);
    if (!loaded_plan.ok()) return bad_input(loaded_plan.error().message);
    plan = std::move(*loaded_plan);
  }
  // Planned here rather than inside create_trainer, so that a restart can say where its time went.
  const auto started = std::chrono::steady_clock::now();
  auto extensions = std::make_shared<const launch::Extensions>();
  StartTimes times;
  auto created = [&]() -> Result<std::unique_ptr<runtime::Trainer>> {
    if (plan) return launch::create_trainer(config, nullptr, &*plan, extensions);
    LOOM_ASSIGN_OR_RETURN(plan::PlanChoice chosen, launch::plan_run(config, *extensions));
    times.plan_s = seconds_since(started);
    return launch::create_trainer(chosen.config, std::move(chosen.plan), nullptr, extensions);
  }();
  if (!created.ok()) return bad_input(created.error().message);
  times.create_s = seconds_since(started) - times.plan_s;
  runtime::Trainer& trainer = **created;
  runtime::install_stop_handlers();  // SIGTERM, SIGINT: stop at the next step boundary
  if (config.parallel.world_size() > 1)
    (void)init_logging(static_cast<int>(trainer.rank()), config.logging.level);
  // Only rank 0 writes the run directory and reports.
  return trainer.rank() == 0 ? train_lead(config, trainer, times) : train_follower(trainer);
#else
  std::fprintf(stderr,
               "loom train: this build has no runtime (configured with LOOM_WITH_RUNTIME=OFF)\n");
  return kExitFailure;
#endif
}

}  // namespace loom::cli
