#include "scheduler/list_scheduler.h"

#include <algorithm>
#include <limits>

namespace loom::sched {

Result<std::vector<std::vector<int>>> list_schedule(const Workload& w, const ListPolicy& pol) {
  const int n = w.size();
  const int p = w.num_devices();
  constexpr double kEps = 1e-9;
  std::vector<std::vector<int>> out_edges(n);
  std::vector<int> missing(n, 0);
  for (int i = 0; i < n; ++i) {
    missing[i] = static_cast<int>(w.deps(i).size());
    for (int d : w.deps(i)) out_edges[d].push_back(i);
  }
  std::vector<double> ready(n, 0), end(n, 0), prio(n, 0);
  for (int i = 0; i < n; ++i) prio[i] = pol.priority ? pol.priority(i) : i;
  std::vector<int> eligible;
  for (int i = 0; i < n; ++i)
    if (!missing[i]) eligible.push_back(i);
  std::vector<double> free_at(p, 0), mem(p, 0);
  std::vector<std::vector<int>> order(p);
  auto shares = [&](int a, int b) {
    for (DeviceId d : w.block(a).devices)
      if (w.block(b).runs_on(d)) return true;
    return false;
  };
  for (int step = 0; step < n; ++step) {
    int best = -1;
    double best_start = std::numeric_limits<double>::infinity();
    for (int i : eligible) {
      const Block& b = w.block(i);
      bool fits = true;
      double st = ready[i];
      for (DeviceId d : b.devices) {
        st = std::max(st, free_at[d.value()]);
        if (!pol.memory_limit.empty() && b.memory > 0 &&
            mem[d.value()] + b.memory > pol.memory_limit[d.value()] + kEps)
          fits = false;
      }
      if (!fits) continue;
      if (best < 0 || st < best_start - kEps ||
          (st < best_start + kEps && (prio[i] < prio[best] || (prio[i] == prio[best] && i < best)))) {
        best = i;
        best_start = st;
      }
    }
    if (best < 0) {
      std::string names;
      for (size_t k = 0; k < eligible.size() && k < 4; ++k)
        names += (k ? ", " : "") + w.block(eligible[k]).id().to_string();
      return error("no block can start within the memory limit (waiting: " + names + ")");
    }
    const Block& b = w.block(best);
    end[best] = best_start + b.duration;
    for (DeviceId d : b.devices) {
      free_at[d.value()] = end[best];
      mem[d.value()] += b.memory;
      order[d.value()].push_back(best);
    }
    eligible.erase(std::find(eligible.begin(), eligible.end(), best));
    for (int v : out_edges[best]) {
      double r = end[best] + (pol.comm_delay > 0 && !shares(best, v) ? pol.comm_delay : 0);
      ready[v] = std::max(ready[v], r);
      if (--missing[v] == 0) eligible.push_back(v);
    }
  }
  return order;
}

}  // namespace loom::sched
