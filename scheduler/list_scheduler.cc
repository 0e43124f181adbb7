#include "scheduler/list_scheduler.h"

#include <algorithm>
#include <limits>

#include "scheduler/validator.h"

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
          (st < best_start + kEps &&
           (prio[i] < prio[best] || (prio[i] == prio[best] && i < best)))) {
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

Workload reversed(const Workload& w) {
  std::vector<Block> blocks = w.blocks();
  std::vector<std::vector<int>> deps(w.size());
  for (int i = 0; i < w.size(); ++i) {
    blocks[i].memory = -blocks[i].memory;
    for (int d : w.deps(i)) deps[d].push_back(i);
  }
  auto r = Workload::create(w.num_devices(), std::move(blocks), std::move(deps));
  LOOM_CHECK(r.ok()) << r.error().to_string();
  return std::move(r).value();
}

namespace {

// Start and end times of `order` run as early as possible (order is valid), and the makespan.
double times(const Workload& w, const std::vector<std::vector<int>>& order, double comm,
             std::vector<double>& start, std::vector<double>& end) {
  auto topo = execution_order(w, order);
  LOOM_CHECK(topo.ok()) << topo.error().to_string();
  std::vector<std::vector<int>> prev(w.size());
  for (const auto& dev : order)
    for (size_t k = 1; k < dev.size(); ++k) prev[dev[k]].push_back(dev[k - 1]);
  start.assign(w.size(), 0);
  end.assign(w.size(), 0);
  double makespan = 0;
  for (int i : *topo) {
    double st = 0;
    for (int d : w.deps(i)) {
      bool share = false;
      for (DeviceId x : w.block(i).devices) share = share || w.block(d).runs_on(x);
      st = std::max(st, end[d] + (share ? 0 : comm));
    }
    for (int q : prev[i]) st = std::max(st, end[q]);
    start[i] = st;
    end[i] = st + w.block(i).duration;
    makespan = std::max(makespan, end[i]);
  }
  return makespan;
}

}  // namespace

std::vector<std::vector<int>> justify(const Workload& w, std::vector<std::vector<int>> order,
                                      const ListPolicy& limits, int rounds) {
  const Workload back = reversed(w);
  std::vector<double> start, end;
  double best = times(w, order, limits.comm_delay, start, end);
  for (int r = 0; r < rounds; ++r) {
    ListPolicy right = limits;
    right.priority = [&](int i) { return -end[i]; };
    auto rev = list_schedule(back, right);
    if (!rev.ok()) break;
    for (auto& dev : *rev) std::reverse(dev.begin(), dev.end());
    std::vector<double> s2, e2;
    times(w, *rev, limits.comm_delay, s2, e2);
    ListPolicy left = limits;
    left.priority = [&](int i) { return s2[i]; };
    auto fwd = list_schedule(w, left);
    if (!fwd.ok()) break;
    std::vector<double> s3, e3;
    double mk = times(w, *fwd, limits.comm_delay, s3, e3);
    if (mk >= best - 1e-9) break;
    best = mk;
    order = std::move(fwd).value();
    start = std::move(s3), end = std::move(e3);
  }
  return order;
}

}  // namespace loom::sched
