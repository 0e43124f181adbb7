// `loom schedule`: build a predefined pipeline schedule, search one for a placement or read one
// from a torch.distributed.pipelining CSV, simulate it, print makespan, bubble ratio and per-device
// peak memory, and optionally write the CSV, an SVG Gantt chart and a chrome trace.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/strings.h"
#include "launch/command.h"
#include "plan/estimate.h"
#include "scheduler/csv.h"
#include "scheduler/placement.h"
#include "scheduler/predefined.h"
#include "scheduler/render.h"
#include "scheduler/repetend.h"
#include "scheduler/schedule_spec.h"
#include "scheduler/simulator.h"

namespace loom::cli {

namespace {

using namespace loom::sched;

int fail(int code, const std::string& message) {
  std::fprintf(stderr, "loom schedule: error: %s\n", message.c_str());
  return code;
}

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) return false;
  out << text;
  return static_cast<bool>(out);
}

struct Flags {
  std::string kind;
  int stages = 0;
  int micro_batches = 0;
  int chunks = 1;
  double fwd = 1, bwd = kBackwardForwards, wgrad = 1, comm = 0;
  std::string placement;
  std::optional<double> mem_limit;
  std::string csv, svg, trace;
  std::string from_csv;
  bool json = false;
};

// The schedule of a CSV file at the --fwd/--bwd/--wgrad costs; errors name the file and cell.
Result<CsvSchedule> read_schedule_file(const Flags& f) {
  std::ifstream in(f.from_csv);
  if (!in) return error("cannot read schedule file '" + f.from_csv + "'");
  std::stringstream text;
  text << in.rdbuf();
  CsvImportOptions opt;
  opt.fwd = f.fwd, opt.bwd = f.bwd, opt.wgrad = f.wgrad;
  auto s = read_csv(text.str(), opt);
  if (!s.ok()) return error(f.from_csv + ": " + s.error().message);
  return s;
}

// --placement NAME: the generated shapes, at --stages devices and the --fwd/--bwd/--wgrad costs
// (v-split: ZB-H1's split backward, --bwd its I and --wgrad its W, as --kind zb-h1 reads them).
const std::vector<std::string>& placement_names() {
  static const std::vector<std::string> names = {"v", "v-split", "x", "m", "k"};
  return names;
}

Placement named_placement(const std::string& name, const Flags& f) {
  if (name == "v-split") return Placement::v_shape_split(f.stages, f.fwd, f.bwd, f.wgrad);
  if (name == "x") return Placement::x_shape(f.stages, f.fwd, f.bwd);
  if (name == "m") return Placement::m_shape(f.stages, f.fwd, f.bwd);
  if (name == "k") return Placement::k_shape(f.stages, f.fwd, f.bwd);
  return Placement::v_shape(f.stages, f.fwd, f.bwd);
}

// Memory a schedule takes per (stage, micro-batch) pair, its forward and backward blocks with
// their simulation and drawing: measured 0.5 to 0.9 KiB for every kind at 1000 x 1000, rounded
// up.
constexpr double kScheduleBytesPerCell = 1024;

// Refuses a schedule of `cells` (stage, micro-batch) pairs that would not fit in this machine's
// memory, before allocating any of it (a bad_alloc deep in the builder says nothing useful).
int check_size(const std::string& sizes, double cells) {
  const double memory =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (!(memory > 0) || cells * kScheduleBytesPerCell <= memory) return kExitOk;
  char text[320];
  std::snprintf(text, sizeof text,
                "%s = %.0f (stage, micro-batch) pairs would take about %s of memory (%.0f bytes "
                "each), more than this machine's %s: at most %.0f; lower them",
                sizes.c_str(), cells, human_bytes(cells * kScheduleBytesPerCell).c_str(),
                kScheduleBytesPerCell, human_bytes(memory).c_str(),
                std::floor(memory / kScheduleBytesPerCell));
  return fail(kExitBadInput, text);
}

// Parses the command line into `f`; an exit code when the command stops here (help, a bad flag).
std::optional<int> parse_flags(const Args& args, Flags& f) {
  CLI::App app{"Build or search a pipeline schedule, simulate it and draw it.", "loom schedule"};
  app.add_option("--kind", f.kind, "gpipe|1f1b|interleaved|chimera|looped-bfs|zb-h1|search");
  app.add_option("--from-csv", f.from_csv,
                 "read the schedule from a torch.distributed.pipelining CSV (one row per rank; "
                 "a split backward as I + W, or B + W as torch wrote it before naming I)");
  app.add_option("--stages", f.stages,
                 "P: pipeline devices (for search without --placement: the V-shape's)");
  app.add_option("--micro-batches", f.micro_batches, "M: micro-batches");
  app.add_option("--chunks", f.chunks, "V: stages per device (interleaved, looped-bfs)");
  app.add_option("--fwd", f.fwd, "forward time of one device's share for one micro-batch");
  app.add_option("--bwd", f.bwd, "backward time (zb-h1: the input-gradient part I)");
  app.add_option("--wgrad", f.wgrad, "zb-h1: weight-gradient time W");
  app.add_option("--comm", f.comm, "delay between blocks on different devices");
  app.add_option("--placement", f.placement,
                 "search: placement YAML (configs/placements/), or v, v-split (ZB-H1's I and W), "
                 "x, m, k at --stages devices");
  app.add_option("--mem-limit", f.mem_limit,
                 "per-device memory limit, in micro-batches of activations");
  app.add_option("--csv", f.csv, "write the schedule as torch.distributed.pipelining CSV");
  app.add_option("--svg", f.svg, "write an SVG Gantt chart");
  app.add_option("--trace", f.trace, "write a chrome trace (chrome://tracing, Perfetto)");
  app.add_flag("--json", f.json, "print one JSON object instead of the table");
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 wants them reversed
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    return fail(kExitBadInput, std::string(e.what()) + " (see loom schedule --help)");
  }
  return std::nullopt;
}

// The checks every kind shares, and which schedule the flags ask for; kExitOk or the failure's
// code.
int check_flags(const Flags& f, std::optional<ScheduleSpec>* schedule) {
  const bool imported = !f.from_csv.empty();
  if (imported &&
      (!f.kind.empty() || f.stages || f.micro_batches || f.chunks != 1 || !f.placement.empty()))
    return fail(kExitBadInput,
                "--from-csv takes the stages, ranks and micro-batches from the file; drop "
                "--kind, --stages, --micro-batches, --chunks and --placement");
  if (!imported && f.kind.empty())
    return fail(kExitBadInput, "--kind or --from-csv is required (see loom schedule --help)");
  if (!imported && f.micro_batches == 0)
    return fail(kExitBadInput, "--micro-batches is required (see loom schedule --help)");
  if (imported) {
    *schedule = ScheduleSpec::imported(f.from_csv);
  } else {
    // --kind names a predefined kind or search (whose placement says whether the backward is
    // split); search-zb and csv are parallel.schedule's.
    auto s = ScheduleSpec::parse(f.kind);
    if (!s.ok() || s->as_imported() || (s->as_searched() && s->as_searched()->split_backward)) {
      std::vector<std::string> names = schedule_kind_names();
      names.push_back("search");
      std::string hint = closest_match(f.kind, names);
      return fail(kExitBadInput, "--kind: unknown schedule kind '" + f.kind + "'" +
                                     (hint.empty() ? "" : " (did you mean '" + hint + "'?)") +
                                     "; known: " + join(names, ", "));
    }
    *schedule = *s;
  }
  if (!imported && f.micro_batches < 1)
    return fail(kExitBadInput, "--micro-batches must be at least 1");
  if (f.comm < 0) return fail(kExitBadInput, "--comm must not be negative");
  if (f.mem_limit && !(*f.mem_limit > 0))
    return fail(kExitBadInput, "--mem-limit must be positive");
  if (!imported && f.stages > 0) {  // a placement file's size is checked once it is read
    const bool chunked = (*schedule)->as_predefined() && f.chunks > 1;
    return check_size("--stages " + std::to_string(f.stages) +
                          (chunked ? " x --chunks " + std::to_string(f.chunks) : "") +
                          " x --micro-batches " + std::to_string(f.micro_batches),
                      static_cast<double>(f.stages) * (chunked ? f.chunks : 1) * f.micro_batches);
  }
  return kExitOk;
}

// What the three ways of making a schedule produce.
struct Built {
  Schedule schedule;
  Timeline timeline;
  std::optional<SearchResult> found;  // --kind search only
  std::optional<CsvActions> actions;  // --from-csv only: how the file named its backwards
};

// --from-csv: the file's schedule, simulated at --fwd/--bwd/--wgrad.
int build_imported(Flags& f, Built* b) {
  if (!(f.fwd > 0) || !(f.bwd > 0) || !(f.wgrad > 0))
    return fail(kExitBadInput, "--fwd, --bwd and --wgrad must be positive");
  auto s = read_schedule_file(f);
  if (!s.ok()) return fail(kExitBadInput, s.error().message);
  b->schedule = std::move(s->schedule);
  b->actions = s->actions;
  f.kind = "csv";
  f.micro_batches = s->micro_batches;
  auto t = simulate(b->schedule, SimOptions{f.comm, {}});
  if (!t.ok()) return fail(kExitFailure, t.error().message);
  b->timeline = std::move(t).value();
  return kExitOk;
}

// --kind search: the placement named, read from a file, or the V-shape at --stages.
int load_placement(const Flags& f, Placement* pl) {
  const auto& names = placement_names();
  if (std::find(names.begin(), names.end(), f.placement) != names.end()) {
    if (f.stages < 1)
      return fail(kExitBadInput, "--placement " + f.placement + " needs --stages P");
    if (f.placement == "k" && f.stages < 2)
      return fail(kExitBadInput, "--placement k needs at least 2 --stages");
    if (!(f.fwd > 0) || !(f.bwd > 0) || !(f.wgrad > 0))
      return fail(kExitBadInput, "--fwd, --bwd and --wgrad must be positive");
    *pl = named_placement(f.placement, f);
  } else if (!f.placement.empty()) {
    auto loaded = Placement::load(f.placement);
    if (!loaded.ok()) return fail(kExitBadInput, loaded.error().message);
    *pl = std::move(loaded).value();
    if (f.stages && f.stages != pl->num_devices())
      return fail(kExitBadInput, "--stages " + std::to_string(f.stages) + " disagrees with " +
                                     f.placement + ", which has " +
                                     std::to_string(pl->num_devices()) + " devices");
    // Counted as the stages of a V-shape with as many blocks (a forward and a backward each) per
    // micro-batch.
    const double per_micro_batch = static_cast<double>(pl->blocks().size()) / 2 /
                                   std::max(1, pl->micro_batches_per_instance());
    char stages[32];
    std::snprintf(stages, sizeof stages, "%g", per_micro_batch);
    if (int code = check_size(f.placement + "'s " + stages + " stages per micro-batch (" +
                                  std::to_string(pl->blocks().size()) +
                                  " forward and backward blocks) x --micro-batches " +
                                  std::to_string(f.micro_batches),
                              per_micro_batch * f.micro_batches))
      return code;
  } else {
    if (f.stages < 1)
      return fail(kExitBadInput,
                  "--kind search needs --placement FILE or --stages P (the V-shape)");
    if (!(f.fwd > 0) || !(f.bwd > 0))
      return fail(kExitBadInput, "--fwd and --bwd must be positive");
    *pl = Placement::v_shape(f.stages, f.fwd, f.bwd);
  }
  return kExitOk;
}

int build_searched(const Flags& f, Built* b) {
  if (f.chunks != 1)
    return fail(kExitBadInput,
                "--chunks does not apply to --kind search (the placement says where blocks run)");
  Placement pl;
  if (int code = load_placement(f, &pl)) return code;
  SearchOptions opt;
  opt.memory_limit = f.mem_limit;
  opt.comm_delay = f.comm;
  auto r = search_schedule(pl, f.micro_batches, opt);
  if (!r.ok()) return fail(kExitBadInput, r.error().to_string());
  b->found = std::move(r).value();
  b->schedule = b->found->schedule;
  b->timeline = b->found->timeline;
  return kExitOk;
}

int build_rule(const Flags& f, ScheduleKind kind, Built* b) {
  PipelineSpec spec;
  spec.devices = f.stages;
  spec.micro_batches = f.micro_batches;
  spec.chunks = f.chunks;
  spec.fwd = f.fwd, spec.bwd = f.bwd, spec.wgrad = f.wgrad;
  if (f.stages < 1) return fail(kExitBadInput, "--stages must be at least 1");
  auto s = build_predefined(kind, spec);
  if (!s.ok()) {
    const Error& e = s.error();
    return fail(kExitBadInput, (e.key.empty() ? "" : "--" + e.key + ": ") + e.message);
  }
  b->schedule = std::move(s).value();
  auto t = simulate(b->schedule, SimOptions{f.comm, {}});
  if (!t.ok()) return fail(kExitFailure, t.error().message);
  b->timeline = std::move(t).value();
  return kExitOk;
}

int write_outputs(const Flags& f, const Built& b) {
  if (!f.csv.empty()) {
    auto csv = to_csv(b.schedule);
    if (!csv.ok()) return fail(kExitFailure, csv.error().message);
    if (!write_file(f.csv, *csv)) return fail(kExitFailure, "cannot write '" + f.csv + "'");
  }
  if (!f.svg.empty() && !write_file(f.svg, to_svg(b.schedule, b.timeline)))
    return fail(kExitFailure, "cannot write '" + f.svg + "'");
  if (!f.trace.empty() && !write_file(f.trace, to_chrome_trace(b.schedule, b.timeline)))
    return fail(kExitFailure, "cannot write '" + f.trace + "'");
  return kExitOk;
}

void print_json(const Flags& f, const Built& b, double elapsed, bool over) {
  const Timeline& timeline = b.timeline;
  nlohmann::json j = {{"kind", f.kind},
                      {"devices", b.schedule.num_devices()},
                      {"micro_batches", f.micro_batches},
                      {"makespan", timeline.makespan},
                      {"bubble_ratio", timeline.bubble_ratio},
                      {"peak_memory", timeline.peak_memory},
                      {"search_time_s", b.found ? b.found->search_time_s : elapsed}};
  if (b.found) {
    j["period"] = b.found->repetend.period;
    j["period_lower_bound"] = b.found->repetend.period_lower_bound;
    j["period_optimal"] = b.found->repetend.period_optimal;
    j["warmup"] = b.found->warmup;
    j["cooldown"] = b.found->cooldown;
    j["repetend_instances"] = b.found->repetend_instances;
    j["completion"] = b.found->completion;
  }
  if (b.actions) j["csv_actions"] = to_string(*b.actions);
  if (over) j["over_memory_limit"] = true;
  std::printf("%s\n", j.dump().c_str());
}

void print_table(const Flags& f, const Built& b) {
  const Timeline& timeline = b.timeline;
  std::printf("schedule       %s (%d devices, %d micro-batches)\n", f.kind.c_str(),
              b.schedule.num_devices(), f.micro_batches);
  if (b.actions) std::printf("actions        %s\n", describe(*b.actions).c_str());
  std::printf("makespan       %g\n", timeline.makespan);
  std::printf("bubble ratio   %.4f\n", timeline.bubble_ratio);
  if (b.found) {
    const Repetend& r = b.found->repetend;
    std::printf("period         %g (lower bound %g%s), %d repetend instance(s)\n", r.period,
                r.period_lower_bound,
                r.period_optimal ? ", optimal" : ", node limit hit: not proved optimal",
                b.found->repetend_instances);
    std::printf("warm-up        %g\ncool-down      %g\n", b.found->warmup, b.found->cooldown);
    std::printf("search time    %.4f s (%lld nodes, completion: %s)\n", b.found->search_time_s,
                static_cast<long long>(r.nodes), b.found->completion.c_str());
  }
  std::printf("\ndevice  busy        peak memory\n");
  for (int d = 0; d < b.schedule.num_devices(); ++d)
    std::printf("%-7d %-11g %g\n", d, timeline.busy[d], timeline.peak_memory[d]);
}

}  // namespace

int schedule_main(const Args& args) {
  Flags f;
  if (auto code = parse_flags(args, f)) return *code;
  std::optional<ScheduleSpec> schedule;
  if (int code = check_flags(f, &schedule)) return code;

  const auto t0 = std::chrono::steady_clock::now();
  Built built;
  const int code = schedule->as_imported() ? build_imported(f, &built)
                   : schedule->as_searched()
                       ? build_searched(f, &built)
                       : build_rule(f, schedule->as_predefined()->kind, &built);
  if (code != kExitOk) return code;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (int written = write_outputs(f, built)) return written;

  int over = -1;
  if (f.mem_limit && !built.found)
    for (int d = 0; d < built.schedule.num_devices() && over < 0; ++d)
      if (built.timeline.peak_memory[d] > *f.mem_limit + 1e-9) over = d;
  if (f.json)
    print_json(f, built, elapsed, over >= 0);
  else
    print_table(f, built);
  if (over >= 0) {
    char msg[160];
    std::snprintf(msg, sizeof msg,
                  "device %d peaks at %g micro-batches of activations, over --mem-limit %g", over,
                  built.timeline.peak_memory[over], *f.mem_limit);
    return fail(kExitFailure, msg);
  }
  return kExitOk;
}

}  // namespace loom::cli
