// loom plan CONFIG [key=value ...] --world-size N --out DIR: the plan without processes or
// LibTorch (plan/plan.h's make_plan). Writes every rank's program (programs/rank_K.txt), the
// pipeline schedule (CSV in torch.distributed.pipelining's format, chrome trace, SVG), plan.json
// and a per-rank summary (summary.txt, also printed, and summary.json) of the plan's estimate on
// the run's cost model (plan/estimate.h): parameters held, peak memory, step time, bytes sent.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "core/config.h"
#include "launch/cli_parse.h"
#include "launch/command.h"
#include "launch/config_file.h"
#include "lower/plan_file.h"
#include "plan/plan_dump.h"
#include "plan/plan_for.h"

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
  std::string config_path, out_dir, cost_file;
  std::vector<std::string> overrides;
  int64_t world_size = 0;
  bool no_plan_json = false;
  app.add_option("config", config_path, "the run's YAML config")->required();
  app.add_option("overrides", overrides, "key=value overrides");
  app.add_option("--world-size", world_size, "ranks to plan for (default: dp x tp x pp)");
  app.add_option("--out", out_dir, "directory for the plan files")->required();
  app.add_option("--cost-model", cost_file,
                 "a cost-model file (presets, or one model) instead of the built-in "
                 "configs/cost-model.yaml; the same as cost.file=FILE");
  int64_t top = 5;
  // Checked below rather than with CLI11's PositiveNumber, whose message prints the range as
  // 0 to the largest double, in full.
  app.add_option("--top", top,
                 "with parallel.policy=auto: how many of the best plans to list (at least 1)");
  app.add_flag("--no-plan-json", no_plan_json,
               "skip plan.json (the whole plan; large for thousands of ranks)");
  if (auto code = parse_args(app, args, "plan")) return *code;
  if (top < 1)
    return fail("--top must be at least 1 (the plans to list, the chosen one first), got " +
                std::to_string(top));
  if (!cost_file.empty()) overrides.push_back("cost.file=" + cost_file);
  auto config = load_config_file(config_path, overrides);
  if (!config.ok()) return fail(config.error().message);
  if (app.count("--world-size") == 0) world_size = config->parallel.world_size();
  if (world_size < 1)
    return fail("--world-size must be positive, got " + std::to_string(world_size));
  auto cost = resolve_cost_model(*config);
  if (!cost.ok()) return fail(cost.error().message);
  plan::AutoOptions options;
  options.top = top;
  auto chosen = plan::plan_for(*config, plan::Registries{}, *cost, world_size, options);
  if (!chosen.ok()) return fail(chosen.error().message);
  std::fputs(chosen->search.c_str(), stdout);
  plan::DumpOptions dump;
  dump.plan_json = !no_plan_json;
  auto table = plan::write_plan_dump(out_dir, chosen->config, chosen->plan, dump);
  if (!table.ok()) return fail("--out: " + table.error().message);
  std::fputs(table->c_str(), stdout);
  std::printf(
      "loom plan: wrote %s (%sprograms/rank_K.txt%s, summary.txt, summary.json)\n", out_dir.c_str(),
      no_plan_json ? "" : "plan.json, ",
      chosen->plan.schedule.csv.empty() ? "" : ", schedule.csv, timeline.json, schedule.svg");
  return kExitOk;
}

}  // namespace loom::cli
