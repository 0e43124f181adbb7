// bench/model_plans: paper-size models under plain and structure-aware plans on virtual devices:
// each plan's estimated step time and peak memory per rank, from the same estimate `loom plan`
// prints (plan/plan.h's make_plan on the built-in default cost model). The first plan of each case
// is its baseline; the ratios show what a structure-aware plan (window parallelism for Swin) gains
// over plain dp and tp. Table-driven: a model adds one entry to kCases.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "plan/plan.h"

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
  plan::Estimate estimate;
  double plan_s = 0;
  std::string error;
};

Outcome evaluate(const ModelCase& c, const PlanRow& row, const CostModel& cost) {
  auto config = parse_config(c.yaml, c.label, row.overrides);
  if (!config.ok()) return {{}, 0, config.error().message};
  const auto start = std::chrono::steady_clock::now();
  auto made = plan::make_plan(*config, plan::Registries{}, cost);
  if (!made.ok()) return {{}, 0, made.error().message};
  return {made->estimate,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), ""};
}

}  // namespace

// bench_model_plans [--quick] [--json FILE]: --json also writes every row's config and figures
// (tests/e2e/model_plan_test.cc checks them against `loom plan`'s summary.json).
int main(int argc, char** argv) {
  bool quick = false;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: bench_model_plans [--quick] [--json FILE]\n");
      return 2;
    }
  }
  nlohmann::json rows = nlohmann::json::array();
  const CostModel cost = resolve_cost_model(Config{}).value();  // the built-in default preset
  std::printf(
      "bench/model_plans: estimated step time (cost model %s: %.0f TFLOP/s per device, alpha-beta "
      "links) and memory per rank; ratios against each case's first plan\n",
      cost.name.c_str(), cost.device_flops_per_s / 1e12);
  int failures = 0;
  for (const ModelCase& c : cases()) {
    if (quick && !c.quick) continue;
    std::printf("\n%s\n", c.label.c_str());
    std::printf("  %-15s %12s %8s %12s %12s %12s %12s %9s\n", "plan", "step time", "ratio",
                "peak mem", "activations", "params/rank", "sent/step", "plan time");
    double base = 0;
    for (const PlanRow& row : c.plans) {
      Outcome o = evaluate(c, row, cost);
      if (!o.error.empty()) {
        std::printf("  %-15s failed: %s\n", row.name.c_str(), o.error.c_str());
        ++failures;
        continue;
      }
      const plan::Estimate& e = o.estimate;
      rows.push_back({{"case", c.label},
                      {"plan", row.name},
                      {"yaml", c.yaml},
                      {"overrides", row.overrides},
                      {"step_s", e.step_s},
                      {"max_peak_bytes", e.max_peak_bytes()}});
      if (base == 0) base = e.step_s;
      std::printf("  %-15s %12s %8.2f %12s %12s %11.0fM %12s %7.2f s\n", row.name.c_str(),
                  human_seconds(e.step_s).c_str(), e.step_s / base,
                  human_bytes(e.max_peak_bytes()).c_str(),
                  human_bytes(e.max_activation_bytes()).c_str(), e.max_parameters() / 1e6,
                  human_bytes(e.max_sent_bytes()).c_str(), o.plan_s);
    }
  }
  if (!json_path.empty()) std::ofstream(json_path) << rows.dump(1);
  return failures == 0 ? 0 : 1;
}
