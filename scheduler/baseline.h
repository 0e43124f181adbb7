// Baselines for an arbitrary placement: the rules of the predefined schedules applied to its
// blocks (GPipe: all forwards, then all backwards; 1F1B / Chimera: backward first, oldest
// micro-batch first, forwards only while memory allows; for split backwards the zero-bubble rule,
// I first, then forwards, W where a device would idle, and ZB-H1's own order on its chain). The
// search must never be worse than the best of them that fits the memory limit.
#pragma once

#include <string>
#include <vector>

#include "core/result.h"
#include "scheduler/placement.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace loom::sched {

struct Baseline {
  std::string name;  // "gpipe", "1f1b", "chimera", "zb", "zb-h1"
  Schedule schedule;
  Timeline timeline;
  double makespan() const { return timeline.makespan; }
};

// Every baseline rule that fits the memory limit (per device) for m micro-batches.
std::vector<Baseline> baselines(const Placement& placement, int micro_batches, double memory_limit,
                                const SimOptions& options = {});
// The fastest of baselines(); an error when none fits.
Result<Baseline> best_baseline(const Placement& placement, int micro_batches,
                               const SimOptions& options = {});

}  // namespace loom::sched
