// bench/auto_plan: parallel.policy auto at paper scale against the layouts people pick by hand,
// each estimated on the same cost model under the same memory limit (every layout at the first
// rung of recomputation and ZeRO that fits, as the search takes its own candidates). Prints the
// search's wall time, its winner, every hand-picked layout and the ratio of the winner's
// estimated step time to the best of them (<= 1: the search is at least as good).
#include "plan/auto_plan.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace {

struct Layout {
  std::string label;
  std::vector<std::string> overrides;
};

struct Case {
  std::string label;
  std::string yaml;
  int64_t world = 0;
  std::vector<Layout> by_hand;
};

std::vector<Layout> megatron_gpt3(int64_t world) {
  // Megatron-LM's choices for GPT-3 175B: tp 8 within a node, pp 8 or 16, the rest dp, 1F1B or
  // interleaved, micro-batch 1 or 2, sequence parallelism on.
  std::vector<Layout> out;
  for (int pp : {8, 16})
    for (const char* schedule : {"1f1b", "interleaved"})
      for (int micro : {1, 2}) {
        const bool interleaved = std::string(schedule) == "interleaved";
        Layout l;
        l.label = "tp8 pp" + std::to_string(pp) + " dp" + std::to_string(world / (8 * pp)) + " mb" +
                  std::to_string(micro) + " " + schedule;
        l.overrides = {"parallel.tp=8",
                       "parallel.sp=true",
                       "parallel.pp=" + std::to_string(pp),
                       "parallel.dp=" + std::to_string(world / (8 * pp)),
                       "parallel.schedule=" + std::string(schedule),
                       "parallel.chunks=" + std::string(interleaved ? "2" : "1"),
                       "batch.micro=" + std::to_string(micro)};
        out.push_back(l);
      }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  // --quick (the suite's smoke run): Swin alone, whose search takes seconds; the AlphaFold2 and
  // GPT-3 searches take minutes here.
  std::vector<Case> cases = {
      {"alphafold2 crop 256, 8 devices (a100)",
       "model: {type: evoformer, preset: alphafold2}\nbatch: {global: 8, micro: 1}\n",
       8,
       {{"dp8", {"parallel.dp=8"}},
        {"tp8", {"parallel.tp=8"}},
        {"pp8", {"parallel.pp=8"}},
        {"dap8", {"parallel.policy=dap", "parallel.tp=8"}}}},
      {"swin-6.6b 640px win40, 32 devices (a100)",
       "model: {type: swin, preset: swin-6.6b}\nbatch: {global: 32, micro: 1}\n",
       32,
       {{"dp32", {"parallel.dp=32"}},
        {"tp8 x pp4", {"parallel.tp=8", "parallel.pp=4"}},
        {"window8 x pp4", {"parallel.policy=window", "parallel.tp=8", "parallel.pp=4"}},
        {"dp4 x tp8", {"parallel.dp=4", "parallel.tp=8"}},
        {"dp4 x window8", {"parallel.policy=window", "parallel.dp=4", "parallel.tp=8"}}}},
  };
  if (quick) cases.erase(cases.begin());
  if (!quick)
    cases.push_back({"gpt3-175b, 1024 devices (h100 80 GB)",
                     "model: {type: gpt, preset: gpt3-175b}\nbatch: {global: 1536, micro: "
                     "1}\ncost: {preset: h100}\n",
                     1024, megatron_gpt3(1024)});
  const loom::plan::Registries registries;
  int failures = 0;
  for (const Case& c : cases) {
    auto config = loom::parse_config(c.yaml, c.label, {"parallel.policy=auto"});
    if (!config.ok()) return 2;
    auto cost = loom::resolve_cost_model(*config);
    if (!cost.ok()) return 2;
    auto chosen = loom::plan::auto_plan(*config, registries, *cost, c.world);
    std::printf("\n== %s\n", c.label.c_str());
    if (!chosen.ok()) {
      std::printf("auto: %s\n", chosen.error().message.c_str());
      ++failures;
      continue;
    }
    std::fputs(loom::plan::describe(*chosen).c_str(), stdout);
    double best = 0;
    std::string best_label;
    std::printf("%-40s %12s %12s  %s\n", "by hand", "est. step", "peak/rank", "as planned");
    for (const Layout& l : c.by_hand) {
      auto hand = loom::parse_config(c.yaml, c.label, l.overrides);
      if (!hand.ok()) return 2;
      auto got = loom::plan::plan_within_memory(*hand, registries, *cost, c.world);
      if (!got.ok()) {
        std::printf("%-40s %12s %12s  %s\n", l.label.c_str(), "-", "-",
                    got.error().message.c_str());
        continue;
      }
      std::printf("%-40s %12s %12s  %s\n", l.label.c_str(),
                  loom::human_seconds(got->step_s).c_str(),
                  loom::human_bytes(got->peak_bytes).c_str(), got->label.c_str());
      if (best == 0 || got->step_s < best) {
        best = got->step_s;
        best_label = l.label;
      }
    }
    const double ratio = best > 0 ? chosen->top[0].step_s / best : 0;
    std::printf("auto / best by hand (%s): %.3f  (search %.1f s)\n", best_label.c_str(), ratio,
                chosen->seconds);
    if (best > 0 && ratio > 1.0) ++failures;
  }
  return failures == 0 ? 0 : 1;
}
