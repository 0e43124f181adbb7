#include "lower/schedule_order.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "scheduler/csv.h"
#include "scheduler/predefined.h"
#include "scheduler/repetend.h"

namespace loom::lower {
namespace {

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g GiB", bytes / (1ull << 30));
  return buf;
}

// The found schedule's order on the blocks' real durations (milliseconds: the renderer draws
// one time unit as 1 ms) and memory in micro-batches, for the plan to simulate and draw.
Result<sched::Schedule> at_stage_costs(const sched::Schedule& found, const StageCosts& costs) {
  std::vector<sched::Block> blocks = found.workload().blocks();
  std::vector<std::vector<int>> deps;
  for (int i = 0; i < found.workload().size(); ++i) deps.push_back(found.workload().deps(i));
  for (sched::Block& b : blocks) {
    const double f_ms =
        costs.devices.empty()
            ? 1.0
            : std::max(costs.devices[static_cast<size_t>(b.stage.value())].forward_s, 1e-15) * 1e3;
    const double again_ms =
        costs.devices.empty()
            ? 0.0
            : costs.devices[static_cast<size_t>(b.stage.value())].recompute_s * 1e3;
    b.duration = sched::block_time(b.kind, f_ms, again_ms);
    b.memory = sched::block_memory(b.kind);
  }
  LOOM_ASSIGN_OR_RETURN(auto workload, sched::Workload::create(found.workload().num_devices(),
                                                               std::move(blocks), std::move(deps)));
  return sched::Schedule::from_indices(std::move(workload), found.order(), "search");
}

// parallel.schedule csv: the file's order, checked against the plan: a row per pipeline rank,
// parallel.pp x chunks stages placed as the planner places them (stage s on pipeline rank
// s mod pp) and the step's micro-batches. Errors name
// parallel.schedule_csv, the file and, where there is one, the cell.
Result<sched::CsvSchedule> csv_schedule(const PipelineRequest& request, int pp, int m, int v) {
  const std::string& file = request.schedule.as_imported()->csv;
  auto fail = [&](const std::string& message) {
    return Error::at("parallel.schedule_csv", file + ": " + message);
  };
  std::ifstream in(file);
  if (!in) return Error::at("parallel.schedule_csv", "cannot read schedule file '" + file + "'");
  std::stringstream text;
  text << in.rdbuf();
  // At the units the plan simulates in (sched::block_time of a forward of 1).
  sched::CsvImportOptions units;
  units.input = sched::block_time(sched::BlockKind::kI, 1);
  auto read = sched::read_csv(text.str(), units);
  if (!read.ok()) return fail(read.error().message);
  const sched::Schedule& s = read->schedule;
  if (s.num_devices() != pp)
    return fail("the schedule has " + std::to_string(s.num_devices()) +
                " rows (ranks), parallel.pp is " + std::to_string(pp));
  if (read->num_stages != pp * v)
    return fail("the schedule has " + std::to_string(read->num_stages) +
                " stages, parallel.pp x parallel.chunks is " + std::to_string(pp) + " x " +
                std::to_string(v) + " = " + std::to_string(pp * v));
  if (read->micro_batches != m)
    return fail("the schedule has " + std::to_string(read->micro_batches) +
                " micro-batches, a step has " + std::to_string(m) + " (" + request.batch.formula() +
                ")");
  // The first offending block in reading order, so the message points where a reader looks.
  std::optional<sched::CsvCell> off_rank;
  std::string off_rank_what;
  auto earlier = [](const std::optional<sched::CsvCell>& a, const sched::CsvCell& b) {
    return !a || b.row < a->row || (b.row == a->row && b.column < a->column);
  };
  for (int d = 0; d < pp; ++d)
    for (int i : s.order()[static_cast<size_t>(d)]) {
      const sched::Block& b = s.workload().block(i);
      const sched::CsvCell& cell = read->cells[static_cast<size_t>(i)];
      if (b.stage.value() % pp != d && earlier(off_rank, cell)) {
        off_rank = cell;
        off_rank_what = "block " + b.id().to_string() + " runs on row " + std::to_string(d + 1) +
                        ", but the planner places stage " + b.stage.to_string() +
                        " on pipeline rank " + std::to_string(b.stage.value() % pp) + " (row " +
                        std::to_string(b.stage.value() % pp + 1) +
                        "): stage s runs on rank s mod parallel.pp";
      }
    }
  if (off_rank) return fail(off_rank->to_string() + ": " + off_rank_what);
  return read;
}

}  // namespace

Result<sched::Placement> search_placement(int64_t pipeline_devices, bool split_backward,
                                          const StageCosts& costs) {
  const int pp = static_cast<int>(pipeline_devices);
  const sched::Placement v =
      split_backward ? sched::Placement::v_shape_split(pp) : sched::Placement::v_shape(pp);
  if (costs.devices.empty()) return v;
  LOOM_CHECK(static_cast<int>(costs.devices.size()) == pp)
      << costs.devices.size() << " stage costs for parallel.pp " << pp;
  double slowest = 0;
  for (const StageCost& c : costs.devices) slowest = std::max(slowest, c.forward_s);
  // Without the cost model's device memory the search keeps today's bound: at most pp
  // micro-batches in flight on any device (1F1B's peak, on device 0).
  const bool memory = costs.device_memory_bytes > 0;
  std::vector<double> share(costs.devices.size(), 1.0);
  if (memory)
    for (size_t d = 0; d < costs.devices.size(); ++d) {
      const StageCost& c = costs.devices[d];
      const double room = costs.device_memory_bytes - c.held_bytes;
      if (room < c.activation_bytes)
        return Error::at(
            "parallel.schedule",
            "search: pipeline device " + std::to_string(d) + " has " +
                gib(costs.device_memory_bytes) +
                " of device memory (cost.device_memory_bytes); parameters, gradients, "
                "optimizer state and a backward's working memory take " +
                gib(c.held_bytes) + ", which leaves " + gib(std::max(room, 0.0)) +
                ", less than one micro-batch's activations (" + gib(c.activation_bytes) +
                "): no schedule fits; use more pipeline stages or a smaller batch.micro");
      share[d] = c.activation_bytes > 0 ? c.activation_bytes / room : 0.0;
    }
  std::vector<sched::PlacedBlock> blocks = v.blocks();
  for (sched::PlacedBlock& b : blocks) {
    const size_t d = static_cast<size_t>(b.devices[0].value());
    const double f =
        slowest > 0
            ? std::max(1.0, std::round(costs.devices[d].forward_s / slowest * kSearchGrid)) /
                  kSearchGrid
            : 1.0;
    const double again =
        slowest > 0 ? std::round(costs.devices[d].recompute_s / slowest * kSearchGrid) / kSearchGrid
                    : 0.0;
    b.span = sched::block_time(b.kind, f, again);
    b.memory = sched::block_memory(b.kind) * share[d];
  }
  return sched::Placement::create(pp, memory ? 1.0 : static_cast<double>(pp), std::move(blocks));
}

namespace {

// The searched schedule's order (its blocks at the stage costs' durations).
Result<sched::Schedule> searched_order(int pp, bool split_backward, int m, int v,
                                       const StageCosts& costs, sched::SearchMemo* searches) {
  if (v != 1)
    return Error::at("parallel.chunks", "the searched schedule places one stage per device");
  LOOM_ASSIGN_OR_RETURN(sched::Placement placement, search_placement(pp, split_backward, costs));
  sched::SearchOptions options;
  options.node_limit = kSearchNodeLimit;
  auto found = searches ? searches->search(placement, m, options)
                        : sched::search_schedule(placement, m, options);
  if (!found.ok()) return Error::at("parallel.schedule", found.error().message);
  auto searched = at_stage_costs(found->schedule, costs);
  LOOM_CHECK(searched.ok()) << searched.error().to_string();
  return std::move(searched).value();
}

// A predefined kind's schedule at sched::block_time of a forward of 1 per device share.
Result<sched::Schedule> predefined_order(const BatchSpec& batch, sched::ScheduleKind kind, int pp,
                                         int m, int v) {
  sched::PipelineSpec spec = sched::PipelineSpec::of(pp, m, v);
  if (kind == sched::ScheduleKind::kZbH1) {  // its spec's bwd is the split backward's I
    spec.bwd = sched::block_time(sched::BlockKind::kI, spec.fwd);
    spec.wgrad = sched::block_time(sched::BlockKind::kW, spec.fwd);
  }
  auto built = sched::build_predefined(kind, spec);
  if (!built.ok())
    return Error::at("parallel.schedule", built.error().message +
                                              " (m: the micro-batches per step, " +
                                              batch.formula() + " = " + std::to_string(m) +
                                              "; p: parallel.pp " + std::to_string(pp) + ")");
  return std::move(built).value();
}

}  // namespace

// Each rank's order of pipeline blocks for `schedule`, from the scheduler: rank r runs the
// blocks of pipeline device (r's pp coordinate). Empty without pipeline parallelism.
Result<PipelineOrder> pipeline_order(const PipelineRequest& request, const StageCosts& costs,
                                     sched::SearchMemo* searches) {
  const sched::ScheduleSpec& schedule = request.schedule;
  PipelineOrder result;
  if (request.pp == 1 && request.chunks == 1) return result;
  const int pp = static_cast<int>(request.pp), m = static_cast<int>(request.micro_batches),
            v = static_cast<int>(request.chunks);
  sched::Schedule built;
  if (const auto* searched = schedule.as_searched()) {
    LOOM_ASSIGN_OR_RETURN(built,
                          searched_order(pp, searched->split_backward, m, v, costs, searches));
  } else if (schedule.as_imported()) {
    LOOM_ASSIGN_OR_RETURN(sched::CsvSchedule imported, csv_schedule(request, pp, m, v));
    result.csv_actions = imported.actions;
    built = std::move(imported.schedule);
  } else {
    LOOM_ASSIGN_OR_RETURN(
        built, predefined_order(request.batch, schedule.as_predefined()->kind, pp, m, v));
  }
  const std::vector<std::vector<sched::BlockId>> orders = built.device_orders();
  result.schedule = std::make_shared<const sched::Schedule>(std::move(built));
  // Ranks are laid out tp fastest, then cp, then dp, then pp (planner/mesh.h).
  const int64_t world = request.pp * request.ranks_per_stage;
  std::vector<std::vector<ProgramBlock>>& out = result.ranks;
  out.resize(static_cast<size_t>(world));
  // Chimera's up pipeline (odd micro-batches) runs its own replica of stage s, numbered p + s by
  // the planner (planner/chimera.h).
  const bool chimera = schedule.is(sched::ScheduleKind::kChimera);
  for (int64_t r = 0; r < world; ++r)
    for (const sched::BlockId& b : orders[static_cast<size_t>(r / request.ranks_per_stage)]) {
      const bool up = chimera && b.mb.value() % 2 == 1;
      const StageId stage = up ? StageId(pp + b.stage.value()) : b.stage;
      out[static_cast<size_t>(r)].push_back({b.kind, stage, b.mb});
    }
  return result;
}

}  // namespace loom::lower
