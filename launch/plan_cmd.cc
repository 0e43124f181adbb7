// loom plan CONFIG [key=value ...] --world-size N --out DIR: the plan without processes or
// LibTorch. Writes every rank's program (programs/rank_K.txt), the pipeline schedule (CSV in
// torch.distributed.pipelining's format, chrome trace, SVG) and a per-rank summary
// (summary.txt, also printed): parameters held, an estimate of peak memory, the bytes each
// rank sends per step by primitive, and an estimated step time (launch/plan_figures.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "core/config.h"
#include "exec/lower/program.h"
#include "exec/lower/schedule_order.h"
#include "graph/op_registry.h"
#include "launch/cli_parse.h"
#include "launch/command.h"
#include "launch/files.h"
#include "launch/plan_figures.h"
#include "models/model.h"
#include "planner/cost.h"
#include "scheduler/csv.h"
#include "scheduler/predefined.h"
#include "scheduler/render.h"
#include "scheduler/simulator.h"

namespace loom::cli {
namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "loom plan: error: %s\n", message.c_str());
  return kExitBadInput;
}

}  // namespace

int plan_main(const Args& args) {
  CLI::App app{
      "Make a plan without starting processes: per-rank programs, schedule, memory and "
      "communication estimates.",
      "loom plan"};
  std::string config_path, out_dir;
  std::vector<std::string> overrides;
  int64_t world_size = 0;
  app.add_option("config", config_path, "the run's YAML config")->required();
  app.add_option("overrides", overrides, "key=value overrides");
  app.add_option("--world-size", world_size, "ranks to plan for (default: dp x tp x pp)");
  app.add_option("--out", out_dir, "directory for the plan files")->required();
  if (auto code = parse_args(app, args, "plan")) return *code;
  auto config = load_config(config_path, overrides);
  if (!config.ok()) return fail(config.error().message);
  if (world_size == 0) world_size = config->parallel.world_size();
  if (world_size < 1)
    return fail("--world-size must be positive, got " + std::to_string(world_size));

  auto ops = graph::OpRegistry::with_builtin_ops();
  auto planned = models::build_plan(*config, ops, planner::PolicyRegistry::with_builtin_policies(),
                                    world_size);
  if (!planned.ok()) return fail(planned.error().message);
  auto order = lower::pipeline_order(*config, config->micro_batches());
  if (!order.ok()) return fail(order.error().message);
  lower::PathFinder paths;
  auto lowered = lower::lower(*planned, world_size, config->micro_batches(), paths,
                              order->empty() ? nullptr : &*order);
  if (!lowered.ok()) return fail(lowered.error().message);

  // Pipeline schedule with forward 1 and backward 2 time units per stage.
  const auto& par = config->parallel;
  std::vector<double> peak_units(static_cast<size_t>(par.pp), 1.0);
  double bubble = 0;
  std::string csv, trace, svg;
  if (par.pp > 1 || par.chunks > 1) {
    auto kind = sched::parse_schedule_kind(par.schedule == "search" ? "1f1b" : par.schedule);
    if (kind.ok()) {
      auto schedule = sched::build_predefined(
          *kind, sched::PipelineSpec::of(static_cast<int>(par.pp),
                                         static_cast<int>(config->micro_batches()),
                                         static_cast<int>(par.chunks)));
      if (!schedule.ok())
        return fail(config->where("parallel.schedule") +
                    ": parallel.schedule: " + schedule.error().message);
      auto timeline = sched::simulate(*schedule);
      if (timeline.ok()) {
        for (size_t d = 0; d < peak_units.size() && d < timeline->peak_memory.size(); ++d)
          peak_units[d] = timeline->peak_memory[d];
        bubble = timeline->bubble_ratio;
        if (auto c = sched::to_csv(*schedule); c.ok()) csv = *c;
        trace = sched::to_chrome_trace(*schedule, *timeline);
        svg = sched::to_svg(*schedule, *timeline);
      }
    }
  }

  namespace fs = std::filesystem;
  const fs::path out(out_dir);
  std::error_code ec;
  fs::create_directories(out / "programs", ec);
  if (ec) return fail("--out: cannot create '" + out.string() + "': " + ec.message());
  for (int64_t r = 0; r < world_size; ++r)
    if (Status s = write_file_atomically(out / "programs" / ("rank_" + std::to_string(r) + ".txt"),
                                         lower::listing(*planned, *lowered, Rank(r)));
        !s.ok())
      return fail(s.error().message);
  if (!csv.empty()) (void)write_file_atomically(out / "schedule.csv", csv);
  if (!trace.empty()) (void)write_file_atomically(out / "timeline.json", trace);
  if (!svg.empty()) (void)write_file_atomically(out / "schedule.svg", svg);

  // Per-rank figures.
  const PlanFigures figures = plan_figures(*config, *planned, *lowered, peak_units, bubble);
  std::ostringstream table;
  table << "plan: " << config->model.type << " " << config->model.preset << " on " << world_size
        << " ranks (dp " << par.dp << " x tp " << par.tp << " x pp " << par.pp << "), "
        << config->micro_batches() << " micro-batches per step, schedule " << par.schedule;
  if (par.pp > 1) table << ", bubble ratio " << bubble;
  char step[128];
  std::snprintf(step, sizeof step, "est. step time %.3f s (at %.0f TFLOP/s per device)",
                figures.step_time_s, kDeviceFlops / 1e12);
  table << "\n" << step << "\n";
  table
      << "rank  parameters  est. peak memory (params+grads+optimizer+activations)  sent per step\n";
  for (int64_t r = 0; r < world_size; ++r) {
    const RankFigures& rf = figures.ranks[static_cast<size_t>(r)];
    double total_sent = 0;
    std::string kinds;
    for (const auto& [k, b] : rf.sent) {
      total_sent += b;
      kinds += " " + k + " " + human_bytes(b) + ";";
    }
    char line[256];
    std::snprintf(line, sizeof line, "%4lld  %10.3fM  %10s = %s + %s + %s + %s  %s",
                  static_cast<long long>(r), rf.parameters / 1e6,
                  human_bytes(rf.peak_bytes).c_str(), human_bytes(rf.param_bytes).c_str(),
                  human_bytes(rf.param_bytes).c_str(), human_bytes(rf.optimizer_bytes).c_str(),
                  human_bytes(rf.activation_bytes).c_str(), human_bytes(total_sent).c_str());
    table << line << (kinds.empty() ? "" : "  (" + kinds.substr(1) + ")") << "\n";
  }
  if (Status s = write_file_atomically(out / "summary.txt", table.str()); !s.ok())
    return fail(s.error().message);
  std::fputs(table.str().c_str(), stdout);
  std::printf("loom plan: wrote %s (programs/rank_K.txt%s, summary.txt)\n", out.string().c_str(),
              csv.empty() ? "" : ", schedule.csv, timeline.json, schedule.svg");
  return kExitOk;
}

}  // namespace loom::cli
