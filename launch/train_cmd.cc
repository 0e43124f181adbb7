// loom train CONFIG [key=value ...]: validates everything, then creates the run directory,
// writes the resolved config, trains, and appends one JSON line per step to metrics.jsonl (and
// the same values as TensorBoard scalars under logging.tensorboard).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
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
#include "observe/event_file.h"

#if LOOM_HAVE_RUNTIME
#include "exec/lower/plan_file.h"
#include "exec/runtime/trainer.h"
#include "models/model.h"
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

  auto loaded = load_config(config_path, overrides);
  if (!loaded.ok()) return bad_input(loaded.error().message);
  const Config& config = *loaded;
  if (Status s = init_logging(-1, config.logging.level); !s.ok())
    return bad_input(s.error().message);

#if LOOM_HAVE_RUNTIME
  std::optional<lower::PlanFile> plan;
  if (!plan_path.empty()) {
    auto loaded_plan = lower::load_plan_file(plan_path);
    if (!loaded_plan.ok()) return bad_input(loaded_plan.error().message);
    plan = std::move(*loaded_plan);
  }
  auto created = runtime::Trainer::create(config, nullptr, plan ? &*plan : nullptr);
  if (!created.ok()) return bad_input(created.error().message);
  runtime::Trainer& trainer = **created;
  const bool lead = trainer.rank() == 0;  // only rank 0 writes the run directory and reports
  if (config.parallel.world_size() > 1)
    (void)init_logging(static_cast<int>(trainer.rank()), config.logging.level);
  if (!lead) {
    for (int64_t i = trainer.steps_done(); i < config.run.steps; ++i)
      if (auto st = trainer.step(); !st.ok()) {
        std::fprintf(stderr, "loom train: rank %lld: error: %s\n",
                     static_cast<long long>(trainer.rank()), st.error().message.c_str());
        return kExitFailure;
      }
    return kExitOk;
  }

  // Only now, with every input validated, does anything get written: the event file first, so a
  // logging.tensorboard that cannot be written leaves no run directory behind.
  std::unique_ptr<observe::EventFileWriter> tensorboard;
  if (!config.logging.tensorboard.empty()) {
    auto opened = observe::EventFileWriter::open(config.logging.tensorboard);
    if (!opened.ok())
      return bad_input(config.error("logging.tensorboard", opened.error().message).message);
    tensorboard = std::move(*opened);
  }
  namespace fs = std::filesystem;
  const fs::path run_dir = config.run.output_dir;
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec)
    return bad_input("run.output_dir: cannot create '" + run_dir.string() + "': " + ec.message());
  if (Status s = write_file_atomically(run_dir / "config.yaml", to_yaml(config)); !s.ok())
    return bad_input(s.error().message);
  // A resumed run appends to the metrics of the run it continues.
  const int64_t resumed_at = trainer.steps_done();
  std::ofstream metrics(run_dir / "metrics.jsonl",
                        resumed_at > 0 ? std::ios::app : std::ios::trunc);
  if (!metrics) return bad_input("cannot write " + (run_dir / "metrics.jsonl").string());

  const bool tty = isatty(STDOUT_FILENO);
  const int64_t total = config.run.steps;
  std::printf("loom: training %s (%s) for %lld steps, %lld micro-batches of %lld per step -> %s\n",
              config.model.type.c_str(), config.model.preset.c_str(), static_cast<long long>(total),
              static_cast<long long>(config.micro_batches()),
              static_cast<long long>(config.batch.micro), run_dir.string().c_str());
  std::fflush(stdout);
  double elapsed = 0, first_loss = 0, last_loss = 0;
  if (resumed_at > 0)
    std::printf("loom: resumed from step %lld\n", static_cast<long long>(resumed_at));
  const auto items = models::items_per_sample(config);
  const char* rate = items.ok() ? items->rate_label.c_str() : "samples/s";
  for (int64_t i = resumed_at; i < total; ++i) {
    auto st = trainer.step();
    if (!st.ok()) {
      if (tty) std::printf("\n");
      // Data errors are the user's; a communication failure is the run's.
      if (st.error().key == "comm") {
        std::fprintf(stderr, "loom train: rank 0: error: %s\n", st.error().message.c_str());
        return kExitFailure;
      }
      return bad_input(st.error().message);
    }
    elapsed += st->step_time_s;
    if (i == resumed_at) first_loss = st->loss;
    last_loss = st->loss;
    nlohmann::json line = {{"step", st->step},
                           {"loss", st->loss},
                           {"lr", st->lr},
                           {"grad_norm", st->grad_norm},
                           {"step_time_s", st->step_time_s},
                           {"tokens_per_s", st->tokens_per_s},
                           {"peak_mem_bytes", st->peak_mem_bytes}};
    metrics << line.dump() << "\n" << std::flush;
    if (tensorboard)
      if (Status s = tensorboard->write_scalars(st->step, scalars_of(line), unix_seconds());
          !s.ok())
        return bad_input(config.error("logging.tensorboard", s.error().message).message);
    if (!st->trace_summary.empty()) {
      std::printf("%sloom: %s\n", tty ? "\n" : "", st->trace_summary.c_str());
      std::fflush(stdout);
    }
    const double eta =
        elapsed / static_cast<double>(i + 1 - resumed_at) * static_cast<double>(total - i - 1);
    if (tty) {
      const int width = 24;
      int filled = static_cast<int>(width * (i + 1) / total);
      std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
      std::printf("\r  step %lld/%lld [%s] loss %.4f  %s %s  ETA %s  ",
                  static_cast<long long>(st->step), static_cast<long long>(total), bar.c_str(),
                  st->loss, format_rate(st->tokens_per_s).c_str(), rate,
                  format_duration(eta).c_str());
      std::fflush(stdout);
    } else if (st->step % config.logging.every == 0 || st->step == total) {
      std::printf("step %lld/%lld loss %.6f lr %.3g grad_norm %.4f %s %s step_time %.3fs ETA %s\n",
                  static_cast<long long>(st->step), static_cast<long long>(total), st->loss, st->lr,
                  st->grad_norm, format_rate(st->tokens_per_s).c_str(), rate, st->step_time_s,
                  format_duration(eta).c_str());
      std::fflush(stdout);
    }
  }
  if (tty) std::printf("\n");
  // The event file's last second of scalars: written now, so that a failure is reported.
  if (tensorboard)
    if (Status s = tensorboard->flush(); !s.ok())
      return bad_input(config.error("logging.tensorboard", s.error().message).message);
  std::printf("loom: done: loss %.4f -> %.4f in %s; metrics in %s\n", first_loss, last_loss,
              format_duration(elapsed).c_str(), (run_dir / "metrics.jsonl").string().c_str());
  return kExitOk;
#else
  std::fprintf(stderr,
               "loom train: this build has no runtime (configured with LOOM_WITH_RUNTIME=OFF)\n");
  return kExitFailure;
#endif
}

}  // namespace loom::cli
