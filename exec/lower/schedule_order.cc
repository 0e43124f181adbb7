#include "exec/lower/schedule_order.h"

#include "scheduler/predefined.h"
#include "scheduler/repetend.h"

namespace loom::lower {

// Each rank's order of pipeline blocks for parallel.schedule, from the scheduler: rank r runs
// the blocks of pipeline device (r's pp coordinate). Empty without pipeline parallelism.
Result<std::vector<std::vector<ProgramBlock>>> pipeline_order(const Config& config,
                                                              int64_t micro_batches) {
  const auto& p = config.parallel;
  if (p.pp == 1 && p.chunks == 1) return std::vector<std::vector<ProgramBlock>>{};
  const int pp = static_cast<int>(p.pp), m = static_cast<int>(micro_batches),
            v = static_cast<int>(p.chunks);
  std::vector<std::vector<sched::BlockId>> orders;
  if (p.schedule == "zb-h1")
    return config.error("parallel.schedule",
                        "zb-h1 splits the backward pass into input- and weight-gradient passes, "
                        "which loom train does not run; it is available to loom schedule");
  if (p.schedule == "search") {
    if (v != 1)
      return config.error("parallel.chunks", "the searched schedule places one stage per device");
    sched::SearchOptions options;
    options.memory_limit = static_cast<double>(pp);
    auto found = sched::search_schedule(sched::Placement::v_shape(pp), m, options);
    if (!found.ok()) return config.error("parallel.schedule", found.error().message);
    orders = found->schedule.device_orders();
  } else {
    auto kind = sched::parse_schedule_kind(p.schedule);
    if (!kind.ok()) return config.error("parallel.schedule", kind.error().message);
    auto o = sched::device_orders(*kind, pp, m, v);
    if (!o.ok())
      return config.error("parallel.schedule",
                          o.error().message + " (m: the micro-batches per step, batch.global " +
                              std::to_string(config.batch.global) + " / (batch.micro " +
                              std::to_string(config.batch.micro) + " x parallel.dp " +
                              std::to_string(p.dp) + ") = " + std::to_string(m) +
                              "; p: parallel.pp " + std::to_string(pp) + ")");
    orders = std::move(o).value();
  }
  // Ranks are laid out tp fastest, then dp, then pp (planner/mesh.h).
  const int64_t world = p.world_size();
  std::vector<std::vector<ProgramBlock>> out(static_cast<size_t>(world));
  for (int64_t r = 0; r < world; ++r)
    for (const sched::BlockId& b : orders[static_cast<size_t>(r / (p.tp * p.dp))]) {
      if (b.kind != sched::BlockKind::kF && b.kind != sched::BlockKind::kB)
        return config.error("parallel.schedule",
                            "block " + b.describe() + " is not a full forward or backward");
      // Chimera's up pipeline (odd micro-batches) runs its own replica of stage s, numbered p + s
      // by the planner (planner/chimera.h).
      const bool up = p.schedule == "chimera" && b.mb.value() % 2 == 1;
      const StageId stage = up ? StageId(pp + b.stage.value()) : b.stage;
      out[static_cast<size_t>(r)].push_back(
          {b.kind == sched::BlockKind::kF ? BlockKind::kForward : BlockKind::kBackward, stage,
           b.mb});
    }
  return out;
}

}  // namespace loom::lower
