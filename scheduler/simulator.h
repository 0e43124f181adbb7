// The simulator: start times from dependencies and device exclusivity (each device runs its
// blocks in order; a multi-device block starts when all its devices are free), plus the
// makespan, the bubble ratio, and memory per device over time.
#pragma once

#include <vector>

#include "core/result.h"
#include "scheduler/schedule.h"

namespace loom::sched {

struct SimOptions {
  // Time added between a producer and a consumer that do not share a device set.
  double comm_delay = 0;
  // Per device, the factor its blocks' durations are taken at (a device slower or faster than
  // the one the schedule was timed for); empty: 1 for every device.
  std::vector<double> device_factor;
  // Every block takes one step, whatever its duration (the CSV's cells): the steps a schedule's
  // order alone gives.
  bool unit_durations = false;
};

// Memory of one device from `time` on (micro-batches of activations).
struct MemoryPoint {
  double time = 0;
  double memory = 0;
  friend bool operator==(const MemoryPoint& a, const MemoryPoint& b) {
    return a.time == b.time && a.memory == b.memory;
  }
};

struct Timeline {
  std::vector<double> start;  // per workload block index (time units)
  std::vector<double> end;
  double makespan = 0;
  // Idle device-time / (devices x makespan).
  double bubble_ratio = 0;
  std::vector<double> busy;                            // per device: time spent running blocks
  std::vector<double> peak_memory;                     // per device
  std::vector<std::vector<MemoryPoint>> memory_trace;  // per device, a step function

  double max_peak_memory() const;
};

// Errors: the deadlock (validator.h) naming the blocks that wait on each other.
Result<Timeline> simulate(const Schedule& schedule, const SimOptions& options = {});

// Peak memory of device d when it runs `order` (workload indices): memory depends only on the
// device's order, since positive changes apply at a block's start and negative at its end.
double order_peak_memory(const Workload& workload, const std::vector<int>& order);

}  // namespace loom::sched
