// Schedule: a workload plus, for every device, the order in which it runs its blocks. This is
// what the executor consumes (device_order) and what the simulator times.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/result.h"
#include "scheduler/validator.h"
#include "scheduler/workload.h"

namespace loom::sched {

class Schedule {
 public:
  Schedule() = default;
  // Validates the order (validator.h); `name` says where it came from ("1f1b", "search").
  static Result<Schedule> create(Workload workload, std::vector<std::vector<BlockId>> order,
                                 std::string name = "");
  static Result<Schedule> from_indices(Workload workload, std::vector<std::vector<int>> order,
                                       std::string name = "");
  // The same order of the same blocks, each taking `duration(block)` (Workload::with_durations):
  // a predefined schedule re-timed at a plan's costs. The order is valid already.
  Result<Schedule> with_durations(const std::function<double(const Block&)>& duration) const;

  const Workload& workload() const { return workload_; }
  int num_devices() const { return workload_.num_devices(); }
  const std::string& name() const { return name_; }
  // Indices into workload().blocks(), per device, in execution order.
  const std::vector<std::vector<int>>& order() const { return order_; }
  // Device d's blocks in execution order: the executor's program skeleton for rank d.
  std::vector<BlockId> device_order(DeviceId d) const;
  std::vector<std::vector<BlockId>> device_orders() const;

  Status validate() const { return validate_order(workload_, order_); }
  // One line per device: "d0: 0F0 0F1 0B0 ...".
  std::string to_string() const;

  friend bool operator==(const Schedule& a, const Schedule& b) {
    return a.workload_ == b.workload_ && a.order_ == b.order_;
  }
  friend bool operator!=(const Schedule& a, const Schedule& b) { return !(a == b); }

 private:
  Workload workload_;
  std::vector<std::vector<int>> order_;
  std::string name_;
};

}  // namespace loom::sched
