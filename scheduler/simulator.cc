#include "scheduler/simulator.h"

#include <algorithm>

namespace loom::sched {

double Timeline::max_peak_memory() const {
  double m = 0;
  for (double p : peak_memory) m = std::max(m, p);
  return m;
}

double order_peak_memory(const Workload& w, const std::vector<int>& order) {
  double mem = 0, peak = 0;
  for (int i : order) {
    double delta = w.block(i).memory;
    if (delta > 0) mem += delta;
    peak = std::max(peak, mem);
    if (delta < 0) mem += delta;
  }
  return peak;
}

namespace {

bool share_device(const Block& a, const Block& b) {
  for (DeviceId d : a.devices)
    if (b.runs_on(d)) return true;
  return false;
}

}  // namespace

Result<Timeline> simulate(const Schedule& s, const SimOptions& opt) {
  const Workload& w = s.workload();
  LOOM_ASSIGN_OR_RETURN(std::vector<int> topo, execution_order(w, s.order()));
  const int n = w.size();
  const int p = w.num_devices();
  Timeline t;
  t.start.assign(n, 0);
  t.end.assign(n, 0);
  // Predecessor on each device: the previous block in that device's order.
  std::vector<std::vector<int>> prev_on_device(n);
  for (const auto& dev : s.order())
    for (size_t k = 1; k < dev.size(); ++k) prev_on_device[dev[k]].push_back(dev[k - 1]);
  auto duration = [&](const Block& b) {
    if (opt.unit_durations) return 1.0;
    const size_t d = b.devices.empty() ? 0 : static_cast<size_t>(b.devices.front().value());
    return d < opt.device_factor.size() ? b.duration * opt.device_factor[d] : b.duration;
  };
  for (int i : topo) {
    const Block& b = w.block(i);
    double st = 0;
    for (int d : w.deps(i)) {
      double ready = t.end[d];
      if (opt.comm_delay > 0 && !share_device(b, w.block(d))) ready += opt.comm_delay;
      st = std::max(st, ready);
    }
    for (int q : prev_on_device[i]) st = std::max(st, t.end[q]);
    t.start[i] = st;
    t.end[i] = st + duration(b);
    t.makespan = std::max(t.makespan, t.end[i]);
  }
  t.busy.assign(p, 0);
  t.peak_memory.assign(p, 0);
  t.memory_trace.assign(p, {});
  double busy_total = 0;
  for (int d = 0; d < p; ++d) {
    double mem = 0;
    auto& trace = t.memory_trace[d];
    trace.push_back({0, 0});
    auto record = [&](double time) {
      if (!trace.empty() && trace.back().time == time)
        trace.back().memory = mem;
      else if (trace.back().memory != mem)
        trace.push_back({time, mem});
      t.peak_memory[d] = std::max(t.peak_memory[d], mem);
    };
    for (int i : s.order()[d]) {
      const Block& b = w.block(i);
      t.busy[d] += duration(b);
      if (b.memory > 0) mem += b.memory, record(t.start[i]);
      if (b.memory < 0) mem += b.memory, record(t.end[i]);
    }
    busy_total += t.busy[d];
  }
  t.bubble_ratio = t.makespan > 0 ? 1.0 - busy_total / (p * t.makespan) : 0.0;
  return t;
}

}  // namespace loom::sched
