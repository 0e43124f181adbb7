// loom verify --static CONFIG [key=value ...] [--plan FILE] [--world-size N]: the config's plan
// (or FILE's, judged as written even when its seal does not match) proven equal to the
// single-device model without running it (lower/equivalence.h): exit 0 when proven, 1 naming
// the first difference, 2 for a user mistake. LibTorch-free: a 1024-rank plan is judged here.
//
// loom verify CONFIG [key=value ...] [--steps N] [--ranks local|launched] [--json FILE]: the
// config's plan (ranks as threads in this process, or one rank per process under loomrun,
// torchrun or mpirun) against the single-device run of the same config, for a few steps
// (launch/verify.h). Prints the losses, the tensors furthest from one device and the
// per-op oracle's verdict, each figure next to its bound. Exit 0 when everything is within the
// tolerance policy, 1 otherwise (naming the first op, step or tensor), 2 for a user mistake.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/durable_file.h"
#include "launch/cli_parse.h"
#include "launch/command.h"
#include "launch/config_file.h"
#include "lower/equivalence.h"
#include "lower/plan_file.h"
#include "plan/plan.h"

#if LOOM_HAVE_RUNTIME
#include "comm/make_comm.h"
#include "launch/verify.h"
#endif

namespace loom::cli {
namespace {

int bad_input(const std::string& message) {
  std::fprintf(stderr, "loom verify: error: %s\n", message.c_str());
  return kExitBadInput;
}

// The static proof of `config`'s plan for `world_size` ranks (0: the config's), or of the plan
// in `plan_path`, against the single-device model the config builds.
int verify_static(const Config& config, const std::string& plan_path, int64_t world_size) {
  const plan::Registries registries;
  auto cost = resolve_cost_model(config);
  if (!cost.ok()) return bad_input(cost.error().to_string());
  plan::Plan made;
  const lower::PlanFile* file = nullptr;
  lower::PlanFile loaded;
  std::string what;
  if (plan_path.empty()) {
    plan::PlanProofs proofs;
    proofs.equivalent = false;  // proven below, timed and reported
    auto p = plan::make_plan(config, registries, *cost, world_size, proofs);
    if (!p.ok()) return bad_input(p.error().to_string());
    made = std::move(p).value();
    file = &made.file;
    what = "the plan of " + config.source + " (" + std::to_string(file->world_size) + " ranks)";
  } else {
    lower::SealState seal = lower::SealState::kMatches;
    auto p = lower::load_plan_file(plan_path, &seal);
    if (!p.ok()) return bad_input(p.error().to_string());
    loaded = std::move(p).value();
    file = &loaded;
    if (world_size > 0 && world_size != file->world_size)
      return bad_input("--world-size " + std::to_string(world_size) + ", but " + plan_path +
                       " is a plan for " + std::to_string(file->world_size) + " ranks");
    if (seal != lower::SealState::kMatches)
      std::printf("loom verify: note: %s %s; judging its content as written\n", plan_path.c_str(),
                  seal == lower::SealState::kMissing
                      ? "has no seal"
                      : "was changed after `loom plan` sealed it (its seal does not match)");
    what = plan_path + " (" + std::to_string(file->world_size) + " ranks)";
  }
  auto model = plan::build_model(config, registries, file->world_size);
  if (!model.ok()) return bad_input(model.error().to_string());
  if (!plan_path.empty() && lower::model_digest(*model) != file->model_digest)
    std::printf(
        "loom verify: note: %s was made from another model than %s builds; judging it "
        "against %s's\n",
        plan_path.c_str(), config.source.c_str(), config.source.c_str());
  lower::ProofStats stats;
  Status proven =
      lower::prove_equivalent(*model, file->graph, file->lowered, file->micro_batches, &stats);
  if (!proven.ok()) {
    std::printf("loom verify --static: %s is NOT equal to one device:\n  %s\n", what.c_str(),
                proven.error().message.c_str());
    return kExitFailure;
  }
  std::printf(
      "loom verify --static: %s is equal to one device: %lld sub-operators, %lld adapters "
      "(forward and gradient paths), %lld gradient syncs, %lld blocks over %lld ranks proven "
      "in %.2f s\n",
      what.c_str(), static_cast<long long>(stats.ops), static_cast<long long>(stats.adapters),
      static_cast<long long>(stats.grad_syncs), static_cast<long long>(stats.blocks),
      static_cast<long long>(stats.ranks), stats.seconds);
  return kExitOk;
}

#if LOOM_HAVE_RUNTIME
// How many of the tensors furthest from one device (relative to their bound) the table shows.
constexpr size_t kWorstShown = 10;

const char* verdict(bool ok) { return ok ? "ok" : "DIFFERS"; }

void print_report(const launch::VerifyReport& r, int64_t steps) {
  std::printf("loom verify: plan %s against one device, %lld steps\n\n", r.plan.c_str(),
              static_cast<long long>(steps));
  std::printf("step  loss plan       loss one device  rel diff   bound\n");
  for (const auto& l : r.losses)
    std::printf("%4lld  %-14.8g %-16.8g %-10.2e %-8.1e %s\n", static_cast<long long>(l.step),
                l.plan, l.single, l.rel_diff, l.bound, verdict(l.ok()));

  // The worst figure per tensor and kind over the steps, worst (against its bound) first.
  std::vector<launch::TensorDifference> worst;
  for (const auto& t : r.tensors) {
    auto it = std::find_if(worst.begin(), worst.end(),
                           [&](const auto& w) { return w.tensor == t.tensor && w.kind == t.kind; });
    if (it == worst.end())
      worst.push_back(t);
    else if (t.rel_diff / t.bound > it->rel_diff / it->bound)
      *it = t;
  }
  std::stable_sort(worst.begin(), worst.end(), [](const auto& a, const auto& b) {
    if (a.judged != b.judged) return a.judged;
    return a.rel_diff / a.bound > b.rel_diff / b.bound;
  });
  std::printf(
      "\n%zu tensors (gradients and values of %lld pieces over ranks and steps); "
      "furthest from their bound:\n",
      worst.size(), static_cast<long long>(r.tensors_compared));
  std::printf("%-28s %-9s %4s %4s  %-16s %-10s %-10s\n", "tensor", "kind", "step", "rank", "piece",
              "rel diff", "bound");
  for (size_t i = 0; i < std::min(worst.size(), kWorstShown); ++i) {
    const auto& t = worst[i];
    std::printf("%-28s %-9s %4lld %4lld  %-16s %-10.2e %-10.2e %s\n", t.tensor.c_str(),
                t.kind.c_str(), static_cast<long long>(t.step), static_cast<long long>(t.rank),
                t.piece.c_str(), t.rel_diff, t.bound, t.judged ? verdict(t.ok()) : "not judged");
  }

  std::printf("\noracle: %lld ops and %lld pieces checked against one device (rel bound %.0e): ",
              static_cast<long long>(r.oracle.ops_checked),
              static_cast<long long>(r.oracle.pieces_checked), r.oracle_tolerance);
  if (r.oracle.mismatches.empty())
    std::printf("every op's output is right\n");
  else
    std::printf("%zu mismatches, first op %s (piece %s)\n", r.oracle.mismatches.size(),
                r.oracle.first_op.c_str(), r.oracle.first_piece.c_str());
}

nlohmann::json report_json(const launch::VerifyReport& r, int64_t steps) {
  nlohmann::json losses = nlohmann::json::array();
  for (const auto& l : r.losses)
    losses.push_back({{"step", l.step},
                      {"plan", l.plan},
                      {"single_device", l.single},
                      {"rel_diff", l.rel_diff},
                      {"bound", l.bound},
                      {"ok", l.ok()}});
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& t : r.tensors)
    tensors.push_back({{"tensor", t.tensor},
                       {"kind", t.kind},
                       {"step", t.step},
                       {"rank", t.rank},
                       {"piece", t.piece},
                       {"rel_diff", t.rel_diff},
                       {"bound", t.bound},
                       {"judged", t.judged},
                       {"ok", t.ok()}});
  return {{"plan", r.plan},
          {"world_size", r.world_size},
          {"steps", steps},
          {"ok", r.ok()},
          {"first_failure", r.first_failure()},
          {"run_error", r.run_error},
          {"losses", losses},
          {"tensors", tensors},
          {"tensors_compared", r.tensors_compared},
          {"oracle",
           {{"ops_checked", r.oracle.ops_checked},
            {"pieces_checked", r.oracle.pieces_checked},
            {"tolerance", r.oracle_tolerance},
            {"first_op", r.oracle.first_op},
            {"first_piece", r.oracle.first_piece},
            {"mismatches", r.oracle.mismatches}}}};
}
#endif

}  // namespace

int verify_main(const Args& args) {
  CLI::App app{
      "Run a config's plan and the single-device run of the same config side by side "
      "and compare losses, gradients, parameters and every op's output.",
      "loom verify"};
  std::string config_path, json_path, ranks = "auto";
  std::vector<std::string> overrides;
  int64_t steps = 3, world_size = 0;
  bool static_proof = false;
  std::string plan_path;
  app.add_option("config", config_path, "the run's YAML config")->required();
  app.add_flag("--static", static_proof,
               "prove the plan equal to one device without running it (any world size)");
  app.add_option("--plan", plan_path,
                 "with --static: judge this plan.json (even one whose seal does not match) "
                 "instead of planning the config");
  app.add_option("--world-size", world_size, "with --static: plan for this many ranks");
  app.add_option("overrides", overrides, "key=value overrides, e.g. parallel.tp=2");
  app.add_option("--steps", steps, "optimizer steps to compare (default 3)");
  app.add_option("--ranks", ranks,
                 "how the plan's ranks run: local (threads in this process), launched (this "
                 "process is one rank, started by loomrun, torchrun or mpirun), auto (launched "
                 "when the launcher's environment says so; default)");
  app.add_option("--json", json_path, "also write the report as JSON to this file");
  if (auto code = parse_args(app, args, "verify")) return *code;
  if (steps < 1) return bad_input("--steps must be at least 1, got " + std::to_string(steps));
  if (ranks != "local" && ranks != "launched" && ranks != "auto")
    return bad_input("--ranks must be local, launched or auto, got '" + ranks + "'");

  if (!static_proof && (!plan_path.empty() || world_size != 0))
    return bad_input("--plan and --world-size go with --static");
  if (world_size < 0) return bad_input("--world-size must be positive");

  auto loaded = load_config_file(config_path, overrides);
  if (!loaded.ok()) return bad_input(loaded.error().message);
  if (static_proof) return verify_static(*loaded, plan_path, world_size);
#if LOOM_HAVE_RUNTIME
  launch::VerifyOptions options;
  options.steps = steps;
  options.launched = ranks == "launched" || (ranks == "auto" && comm::started_by_launcher());
  auto report = launch::verify_plan(*loaded, options);
  if (!report.ok()) return bad_input(report.error().to_string());
  // Rank 0 prints the verdict and exits with it; the others have handed in their figures and
  // exit 0, so that a launcher, which stops the group when a worker fails, lets rank 0 print.
  if (!report->prints) return kExitOk;
  print_report(*report, steps);
  if (!json_path.empty())
    if (Status s = write_file_atomically(json_path, report_json(*report, steps).dump(2) + "\n");
        !s.ok())
      return bad_input("--json: " + s.error().message);
  if (!report->ok()) {
    std::printf("\nFAILED: %s\n", report->first_failure().c_str());
    return kExitFailure;
  }
  std::printf("\nOK: the plan equals one device within the tolerance policy\n");
  return kExitOk;
#else
  return bad_input("this build of loom has no runtime (LOOM_WITH_RUNTIME=OFF)");
#endif
}

}  // namespace loom::cli
