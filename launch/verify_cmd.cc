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
  int64_t steps = 3;
  app.add_option("config", config_path, "the run's YAML config")->required();
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

  auto loaded = load_config_file(config_path, overrides);
  if (!loaded.ok()) return bad_input(loaded.error().message);
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
