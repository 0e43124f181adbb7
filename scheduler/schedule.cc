#include "scheduler/schedule.h"

#include <sstream>

namespace loom::sched {

Result<Schedule> Schedule::create(Workload workload, std::vector<std::vector<BlockId>> order,
                                  std::string name) {
  LOOM_ASSIGN_OR_RETURN(auto idx, resolve_order(workload, order));
  Schedule s;
  s.workload_ = std::move(workload);
  s.order_ = std::move(idx);
  s.name_ = std::move(name);
  return s;
}

Result<Schedule> Schedule::from_indices(Workload workload, std::vector<std::vector<int>> order,
                                        std::string name) {
  LOOM_TRY(validate_order(workload, order));
  Schedule s;
  s.workload_ = std::move(workload);
  s.order_ = std::move(order);
  s.name_ = std::move(name);
  return s;
}

Result<Schedule> Schedule::with_durations(
    const std::function<double(const Block&)>& duration) const {
  Schedule s;
  LOOM_ASSIGN_OR_RETURN(s.workload_, workload_.with_durations(duration));
  s.order_ = order_;
  s.name_ = name_;
  return s;
}

std::vector<BlockId> Schedule::device_order(DeviceId d) const {
  std::vector<BlockId> out;
  for (int i : order_.at(d.value())) out.push_back(workload_.block(i).id());
  return out;
}

std::vector<std::vector<BlockId>> Schedule::device_orders() const {
  std::vector<std::vector<BlockId>> out;
  for (int d = 0; d < num_devices(); ++d) out.push_back(device_order(DeviceId(d)));
  return out;
}

std::string Schedule::to_string() const {
  std::ostringstream os;
  for (int d = 0; d < num_devices(); ++d) {
    os << "d" << d << ":";
    for (int i : order_[d]) os << " " << workload_.block(i).id().to_string();
    os << "\n";
  }
  return os.str();
}

}  // namespace loom::sched
