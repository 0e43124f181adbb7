// bench/model_plans: paper-size models under plain and structure-aware plans on virtual devices:
// each plan's estimated step time and peak memory per rank, from the same figures `loom plan`
// prints (launch/plan_figures.h). The first plan of each case is its baseline; the ratios show
// what a structure-aware plan (window parallelism for Swin) gains over plain dp and tp.
// Table-driven: a model adds one entry to kCases.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "exec/lower/program.h"
#include "exec/lower/schedule_order.h"
#include "launch/plan_figures.h"
#include "models/model.h"
#include "scheduler/predefined.h"
#include "scheduler/simulator.h"

namespace {

using namespace loom;

struct PlanRow {
  std::string name;
  std::vector<std::string> overrides;  // parallel.* keys
};

struct ModelCase {
  std::string label;
  std::string yaml;  // model and batch
  std::vector<PlanRow> plans;
  bool quick = false;  // also run under --quick (the ctest smoke run)
};

const std::vector<ModelCase>& cases() {
  static const std::vector<ModelCase> kCases = {
      {"swin-b 224px, 8 devices",
       "model: {type: swin, preset: swin-b}\nbatch: {global: 64, micro: 8}\n",
       {{"dp8", {"parallel.dp=8"}},
        {"dp2 x tp4", {"parallel.dp=2", "parallel.tp=4"}},
        {"dp2 x window4", {"parallel.policy=window", "parallel.dp=2", "parallel.tp=4"}}},
       true},
      {"swin-6.6b 640px win40, 8 devices",
       "model: {type: swin, preset: swin-6.6b}\nbatch: {global: 16, micro: 1}\n",
       {{"dp8", {"parallel.dp=8"}},
        {"tp8", {"parallel.tp=8"}},
        {"window8", {"parallel.policy=window", "parallel.tp=8"}}}},
      {"swin-6.6b 640px win40, 32 devices",
       "model: {type: swin, preset: swin-6.6b}\nbatch: {global: 32, micro: 1}\n",
       {{"dp32", {"parallel.dp=32"}},
        {"tp8 x pp4", {"parallel.tp=8", "parallel.pp=4"}},
        {"window8 x pp4", {"parallel.policy=window", "parallel.tp=8", "parallel.pp=4"}},
        {"dp4 x tp8", {"parallel.dp=4", "parallel.tp=8"}},
        {"dp4 x window8", {"parallel.policy=window", "parallel.dp=4", "parallel.tp=8"}}}},
      {"swin-6.6b 1536px win48, 32 devices",
       "model: {type: swin, preset: swin-6.6b-1536}\nbatch: {global: 32, micro: 1}\n",
       {{"tp8 x pp4", {"parallel.tp=8", "parallel.pp=4"}},
        {"window8 x pp4", {"parallel.policy=window", "parallel.tp=8", "parallel.pp=4"}}}},
      // The Evoformer: dynamic axial parallelism (DAP) against dp, Megatron tp on the linears
      // and pp over blocks; one sample per micro-batch, as AlphaFold2 trains, and the same
      // samples per step under every plan.
      {"evoformer tiny, 4 devices",
       "model: {type: evoformer, preset: tiny}\nbatch: {global: 4, micro: 1}\n",
       {{"dp4", {"parallel.dp=4"}},
        {"tp4", {"parallel.tp=4"}},
        {"dap4", {"parallel.policy=dap", "parallel.tp=4"}}},
       true},
      {"alphafold2 crop 256, 8 devices",
       "model: {type: evoformer, preset: alphafold2}\nbatch: {global: 8, micro: 1}\n",
       {{"dp8", {"parallel.dp=8"}},
        {"tp8", {"parallel.tp=8"}},
        {"pp8", {"parallel.pp=8"}},
        {"dap8", {"parallel.policy=dap", "parallel.tp=8"}}}},
      {"alphafold2 crop 256, 16 devices",
       "model: {type: evoformer, preset: alphafold2}\nbatch: {global: 16, micro: 1}\n",
       {{"dp16", {"parallel.dp=16"}},
        {"tp16", {"parallel.tp=16"}},
        {"pp16", {"parallel.pp=16"}},
        {"dap16", {"parallel.policy=dap", "parallel.tp=16"}},
        {"dap8 x pp2", {"parallel.policy=dap", "parallel.tp=8", "parallel.pp=2"}},
        {"dap8 x dp2", {"parallel.policy=dap", "parallel.tp=8", "parallel.dp=2"}}}},
  };
  return kCases;
}

struct Outcome {
  cli::PlanFigures figures;
  double plan_s = 0;
  std::string error;
};

Outcome evaluate(const ModelCase& c, const PlanRow& row) {
  Outcome out;
  auto config = parse_config(c.yaml, c.label, row.overrides);
  if (!config.ok()) return {{}, 0, config.error().message};
  const auto start = std::chrono::steady_clock::now();
  const int64_t world = config->parallel.world_size();
  auto planned = models::build_plan(*config, graph::OpRegistry::with_builtin_ops(),
                                    planner::PolicyRegistry::with_builtin_policies(), world);
  if (!planned.ok()) return {{}, 0, planned.error().message};
  auto order = lower::pipeline_order(*config, config->micro_batches());
  if (!order.ok()) return {{}, 0, order.error().message};
  lower::PathFinder paths;
  auto lowered = lower::lower(*planned, world, config->micro_batches(), paths,
                              order->empty() ? nullptr : &*order);
  if (!lowered.ok()) return {{}, 0, lowered.error().message};
  const auto& par = config->parallel;
  std::vector<double> peak_units(static_cast<size_t>(par.pp), 1.0);
  double bubble = 0;
  if (par.pp > 1) {
    auto kind = sched::parse_schedule_kind(par.schedule);
    if (!kind.ok()) return {{}, 0, kind.error().message};
    auto schedule = sched::build_predefined(
        *kind, sched::PipelineSpec::of(static_cast<int>(par.pp),
                                       static_cast<int>(config->micro_batches()), 1));
    if (!schedule.ok()) return {{}, 0, schedule.error().message};
    auto timeline = sched::simulate(*schedule);
    if (!timeline.ok()) return {{}, 0, timeline.error().message};
    for (size_t d = 0; d < peak_units.size() && d < timeline->peak_memory.size(); ++d)
      peak_units[d] = timeline->peak_memory[d];
    bubble = timeline->bubble_ratio;
  }
  out.figures = cli::plan_figures(*config, *planned, *lowered, peak_units, bubble);
  out.plan_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  std::printf(
      "bench/model_plans: estimated step time (at %.0f TFLOP/s per device, alpha-beta links) and "
      "memory per rank; ratios against each case's first plan\n",
      cli::kDeviceFlops / 1e12);
  int failures = 0;
  for (const ModelCase& c : cases()) {
    if (quick && !c.quick) continue;
    std::printf("\n%s\n", c.label.c_str());
    std::printf("  %-15s %12s %8s %12s %12s %12s %12s %9s\n", "plan", "step time", "ratio",
                "peak mem", "activations", "params/rank", "sent/step", "plan time");
    double base = 0;
    for (const PlanRow& row : c.plans) {
      Outcome o = evaluate(c, row);
      if (!o.error.empty()) {
        std::printf("  %-15s failed: %s\n", row.name.c_str(), o.error.c_str());
        ++failures;
        continue;
      }
      // The busiest rank's figures.
      double acts = 0, params = 0, sent = 0;
      for (const auto& r : o.figures.ranks) {
        acts = std::max(acts, r.activation_bytes);
        params = std::max(params, r.parameters);
        double s = 0;
        for (const auto& [k, b] : r.sent) s += b;
        sent = std::max(sent, s);
      }
      if (base == 0) base = o.figures.step_time_s;
      std::printf("  %-15s %10.3f s %8.2f %12s %12s %11.0fM %12s %7.2f s\n", row.name.c_str(),
                  o.figures.step_time_s, o.figures.step_time_s / base,
                  cli::human_bytes(o.figures.max_peak_bytes()).c_str(),
                  cli::human_bytes(acts).c_str(), params / 1e6, cli::human_bytes(sent).c_str(),
                  o.plan_s);
    }
  }
  return failures == 0 ? 0 : 1;
}
