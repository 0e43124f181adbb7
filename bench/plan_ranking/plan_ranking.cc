// bench/plan_ranking: does the cost model rank plans as this machine runs them? GPT small
// (4 layers, hidden 256, heads 4, seq 256, vocab 4096; 8 samples per step, AdamW) on 2 and on 4
// loomrun processes. For each world: `loom calibrate` measures the machine with that many ranks
// (the model's own linears) and writes a cost model; every candidate plan below and the
// auto-planner's winner are estimated on it and trained (`loom train` under loomrun, the
// calibrated cost model as cost.file) in the same run, in interleaved rounds so that the
// machine's drift falls on every plan alike. Prints per plan the estimated and the measured step
// time (median of the steps after the first, then of the rounds), Spearman's rank correlation of
// the two, and the auto plan's measured step over the best measured one.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/spawn.h"
#include "plan/auto_plan.h"

namespace {

namespace fs = std::filesystem;

const char* kModel = R"(run: {seed: 1}
model: {type: gpt, preset: tiny, args: {layers: 4, hidden: 256, heads: 4, seq: 256, vocab: 4096}}
batch: {global: 8, micro: 8}
optimizer: {type: adamw, lr: 0.0003}
comm: {timeout_s: 300, backend: gloo}
)";
// --quick (the suite's smoke run): a model small enough that the whole run takes seconds.
const char* kQuickModel = R"(run: {seed: 1}
model: {type: gpt, preset: tiny, args: {layers: 2, hidden: 64, heads: 2, seq: 32, vocab: 256}}
batch: {global: 8, micro: 8}
optimizer: {type: adamw, lr: 0.0003}
comm: {timeout_s: 120, backend: gloo}
)";

struct Candidate {
  std::string label;
  std::vector<std::string> overrides;
};

// Plans that differ in what the cost model has to get right: the bubble (micro-batches per
// pipeline), communication (tp's activations, dp's gradients, ZeRO-3's gathers), recomputation's
// extra forward, and the size of the products (micro-batch size).
std::vector<Candidate> candidates(int world) {
  auto mb = [](int m) { return "batch.micro=" + std::to_string(m); };
  if (world == 2)
    return {
        {"dp2 mb4", {"parallel.dp=2", mb(4)}},
        {"dp2 mb1", {"parallel.dp=2", mb(1)}},
        {"dp2 mb4 recompute full", {"parallel.dp=2", mb(4), "parallel.recompute=full"}},
        {"dp2 mb4 zero 3", {"parallel.dp=2", mb(4), "parallel.zero=3"}},
        {"tp2 mb8", {"parallel.tp=2", mb(8)}},
        {"tp2 mb2 recompute selective", {"parallel.tp=2", mb(2), "parallel.recompute=selective"}},
        {"pp2 mb1 1f1b", {"parallel.pp=2", mb(1), "parallel.schedule=1f1b"}},
        {"pp2 mb4 gpipe", {"parallel.pp=2", mb(4), "parallel.schedule=gpipe"}},
        {"pp2 mb8", {"parallel.pp=2", mb(8)}},
    };
  return {
      {"dp4 mb2", {"parallel.dp=4", mb(2)}},
      {"dp4 mb2 recompute full", {"parallel.dp=4", mb(2), "parallel.recompute=full"}},
      {"dp2 tp2 mb4", {"parallel.dp=2", "parallel.tp=2", mb(4)}},
      {"tp4 mb8", {"parallel.tp=4", mb(8)}},
      {"dp2 pp2 mb1 1f1b", {"parallel.dp=2", "parallel.pp=2", mb(1), "parallel.schedule=1f1b"}},
      {"tp2 pp2 mb2 1f1b", {"parallel.tp=2", "parallel.pp=2", mb(2), "parallel.schedule=1f1b"}},
      {"pp4 mb1 1f1b", {"parallel.pp=4", mb(1), "parallel.schedule=1f1b"}},
      {"pp4 mb4 gpipe", {"parallel.pp=4", mb(4), "parallel.schedule=gpipe"}},
  };
}

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "bench/plan_ranking: %s\n", message.c_str());
  std::exit(1);
}

// Runs one command (bounded); its output goes to the error stream when it fails.
void run_or_die(const std::vector<std::string>& argv, double deadline_s) {
  const auto results = loom::launch::run_processes({{argv, {}}}, deadline_s);
  if (!results[0].ok()) {
    std::string cmd;
    for (const auto& a : argv) cmd += a + " ";
    die(cmd + "\n" + results[0].describe());
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The ranks of `v` (1 = smallest), ties sharing the mean of their ranks.
std::vector<double> ranks_of(const std::vector<double>& v) {
  std::vector<size_t> order(v.size());
  for (size_t i = 0; i < v.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> r(v.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && v[order[j + 1]] == v[order[i]]) ++j;
    for (size_t k = i; k <= j; ++k) r[order[k]] = 0.5 * static_cast<double>(i + j) + 1;
    i = j + 1;
  }
  return r;
}

// Spearman's rank correlation: Pearson's of the ranks.
double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  const std::vector<double> ra = ranks_of(a), rb = ranks_of(b);
  const double n = static_cast<double>(a.size());
  double ma = 0, mb = 0;
  for (size_t i = 0; i < ra.size(); ++i) ma += ra[i] / n, mb += rb[i] / n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0;
}

// The median step time of one run's metrics.jsonl, the first step (warm-up) left out.
double measured_step(const fs::path& metrics) {
  std::ifstream in(metrics);
  if (!in) die("no " + metrics.string());
  std::vector<double> steps;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) steps.push_back(nlohmann::json::parse(line).at("step_time_s").get<double>());
  if (steps.size() < 2) die(metrics.string() + " has fewer than 2 steps");
  steps.erase(steps.begin());
  return median(steps);
}

struct Row {
  std::string label;
  std::vector<std::string> overrides;  // of the config, for `loom train`
  double estimated_s = 0;
  std::vector<double> measured_s;  // one per round
};

struct Tools {
  std::string loom, loomrun;
  fs::path dir;  // this run's files
};

struct WorldResult {
  int world = 0;
  std::string cost_model;
  std::vector<Row> rows;  // the candidates, then the auto plan
  double rho = 0;
  double auto_over_best = 0;
};

WorldResult bench_world(const Tools& tools, const std::string& yaml, int world, bool quick,
                        int rounds, int steps) {
  WorldResult out;
  out.world = world;
  const fs::path config_path = tools.dir / "gpt_small.yaml";
  std::ofstream(config_path) << yaml;
  const fs::path cost_path = tools.dir / ("cost-" + std::to_string(world) + ".yaml");
  std::vector<std::string> calibrate = {
      tools.loom, "calibrate",       config_path.string(), "--ranks", std::to_string(world),
      "--out",    cost_path.string()};
  if (quick) calibrate.push_back("--quick");
  std::fprintf(stderr, "bench/plan_ranking: calibrating %d ranks ...\n", world);
  run_or_die(calibrate, 1800);
  const std::string cost_file = "cost.file=" + cost_path.string();

  const loom::plan::Registries registries;
  for (const Candidate& c : candidates(world)) {
    std::vector<std::string> overrides = c.overrides;
    overrides.push_back(cost_file);
    auto config = loom::parse_config(yaml, "bench", overrides);
    if (!config.ok()) die(c.label + ": " + config.error().message);
    auto cost = loom::resolve_cost_model(*config);
    if (!cost.ok()) die(cost.error().message);
    out.cost_model = cost->name;
    auto plan = loom::plan::make_plan(*config, registries, *cost);
    if (!plan.ok()) die(c.label + ": " + plan.error().message);
    out.rows.push_back({c.label, overrides, plan->estimate.step_s, {}});
  }
  {
    auto config = loom::parse_config(yaml, "bench", {"parallel.policy=auto", cost_file});
    if (!config.ok()) die(config.error().message);
    auto cost = loom::resolve_cost_model(*config);
    if (!cost.ok()) die(cost.error().message);
    auto chosen = loom::plan::auto_plan(*config, registries, *cost, world);
    if (!chosen.ok()) die("auto: " + chosen.error().message);
    std::fputs(loom::plan::describe(*chosen).c_str(), stderr);
    out.rows.push_back({"auto: " + chosen->top[0].label,
                        {"parallel.policy=auto", cost_file},
                        chosen->top[0].step_s,
                        {}});
  }

  for (int round = 0; round < rounds; ++round)
    for (size_t i = 0; i < out.rows.size(); ++i) {
      Row& row = out.rows[i];
      const fs::path run_dir = tools.dir / ("w" + std::to_string(world) + "_" + std::to_string(i));
      fs::remove_all(run_dir);
      std::vector<std::string> argv = {tools.loomrun,
                                       "--standalone",
                                       "--nproc-per-node",
                                       std::to_string(world),
                                       tools.loom,
                                       "train",
                                       config_path.string(),
                                       "run.steps=" + std::to_string(steps),
                                       "run.output_dir=" + run_dir.string()};
      argv.insert(argv.end(), row.overrides.begin(), row.overrides.end());
      std::fprintf(stderr, "bench/plan_ranking: %d ranks, round %d: %s\n", world, round + 1,
                   row.label.c_str());
      run_or_die(argv, 900);
      row.measured_s.push_back(measured_step(run_dir / "metrics.jsonl"));
    }

  std::vector<double> est, meas;
  for (const Row& r : out.rows) {
    est.push_back(r.estimated_s);
    meas.push_back(median(r.measured_s));
  }
  out.rho = spearman(est, meas);
  const double best = *std::min_element(meas.begin(), meas.end());
  out.auto_over_best = meas.back() / best;
  return out;
}

void print(const WorldResult& w) {
  std::printf("\n== %d loomrun processes, cost model %s\n", w.world, w.cost_model.c_str());
  std::printf("%-44s %12s %12s %10s  %s\n", "plan", "est. ms", "meas. ms", "meas/est",
              "rounds (ms)");
  for (const Row& r : w.rows) {
    const double m = median(r.measured_s);
    std::string each;
    for (double s : r.measured_s)
      each += std::to_string(static_cast<int>(std::lround(s * 1e3))) + " ";
    std::printf("%-44s %12.1f %12.1f %10.2f  %s\n", r.label.c_str(), r.estimated_s * 1e3, m * 1e3,
                m / r.estimated_s, each.c_str());
  }
  std::printf("spearman(estimated, measured) over %zu plans: %.3f\n", w.rows.size(), w.rho);
  std::printf("auto measured / best measured: %.3f\n", w.auto_over_best);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  char self[4096] = {0};
  if (readlink("/proc/self/exe", self, sizeof self - 1) <= 0) return 1;
  const fs::path bin = fs::path(self).parent_path();
  Tools tools{(bin / "loom").string(), (bin / "loomrun").string(), {}};
  if (!fs::exists(tools.loom) || !fs::exists(tools.loomrun))
    die("loom and loomrun are not beside " + std::string(self));
  char dir_template[] = "/tmp/loom-plan-ranking-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) die("cannot create a directory in /tmp");
  tools.dir = dir_template;

  const int rounds = quick ? 1 : 3;
  const int steps = quick ? 2 : 5;
  std::vector<WorldResult> results;
  for (int world : quick ? std::vector<int>{2} : std::vector<int>{2, 4})
    results.push_back(
        bench_world(tools, quick ? kQuickModel : kModel, world, quick, rounds, steps));
  fs::remove_all(tools.dir);
  std::printf(
      "bench/plan_ranking: gpt (%s), 8 samples per step, AdamW; step = median over steps 2..%d, "
      "then over %d rounds\n",
      quick ? "2 layers, hidden 64, heads 2, seq 32, vocab 256"
            : "4 layers, hidden 256, heads 4, seq 256, vocab 4096",
      steps, rounds);
  for (const WorldResult& w : results) print(w);
  return 0;
}
