#include "scheduler/list_scheduler.h"

#include <algorithm>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include "scheduler/validator.h"

namespace loom::sched {

namespace {

constexpr double kEps = 1e-9;

// The blocks that may start, kept so that the next one is found without scanning them all:
// per device, those already released when the device frees up, by (priority, index), and those
// released later, by (release, priority, index); each split by whether it allocates memory, the
// only ones a memory limit can hold back. Blocks on several devices (rare: a tensor-parallel
// stage) are scanned one by one.
class Eligible {
 public:
  Eligible(const Workload& w, const ListPolicy& pol, const std::vector<double>& ready,
           const std::vector<double>& prio, const std::vector<double>& free_at,
           const std::vector<double>& mem)
      : w_(w),
        pol_(pol),
        ready_(ready),
        prio_(prio),
        free_at_(free_at),
        mem_(mem),
        devices_(static_cast<size_t>(w.num_devices())),
        best_on_(devices_.size()),
        changed_(devices_.size(), 1) {}

  void add(int i) {
    const Block& b = w_.block(i);
    if (b.devices.size() != 1) {
      shared_.push_back(i);
      return;
    }
    const size_t d = static_cast<size_t>(b.devices[0].value());
    const bool allocates = b.memory > 0;
    changed_[d] = 1;
    if (ready_[i] <= free_at_[d])
      devices_[d].released[allocates].insert({prio_[i], i});
    else
      devices_[d].later[allocates].insert({ready_[i], prio_[i], i});
  }

  void remove(int i) {
    const Block& b = w_.block(i);
    if (b.devices.size() != 1) {
      shared_.erase(std::find(shared_.begin(), shared_.end(), i));
      return;
    }
    Device& dev = devices_[static_cast<size_t>(b.devices[0].value())];
    const bool allocates = b.memory > 0;
    changed_[static_cast<size_t>(b.devices[0].value())] = 1;
    if (dev.released[allocates].erase({prio_[i], i}) == 0)
      dev.later[allocates].erase({ready_[i], prio_[i], i});
  }

  // Device `d` has moved its free time on (and its memory): what was released by then moves
  // over.
  void advance(DeviceId device) {
    changed_[static_cast<size_t>(device.value())] = 1;
    Device& dev = devices_[static_cast<size_t>(device.value())];
    const double now = free_at_[static_cast<size_t>(device.value())];
    for (int allocates = 0; allocates < 2; ++allocates) {
      auto& later = dev.later[allocates];
      while (!later.empty() && std::get<0>(*later.begin()) <= now) {
        const int i = std::get<2>(*later.begin());
        dev.released[allocates].insert({prio_[i], i});
        later.erase(later.begin());
      }
    }
  }

  // The block that can start earliest within the memory limit, ties to the lower priority and
  // then the lower index; -1 when none can. A device's own best depends on its blocks, free
  // time and memory only, so it is found again only on the devices those changed on.
  int best() {
    Candidate best;
    for (size_t d = 0; d < devices_.size(); ++d) {
      if (changed_[d]) best_on_[d] = best_on(d), changed_[d] = 0;
      best = std::min(best, best_on_[d]);
    }
    for (int i : shared_) {
      const Block& b = w_.block(i);
      double start = ready_[i];
      bool fits = true;
      for (DeviceId dev : b.devices) {
        start = std::max(start, free_at_[static_cast<size_t>(dev.value())]);
        fits = fits && this->fits(b, static_cast<size_t>(dev.value()));
      }
      if (fits) best = std::min(best, Candidate{start, prio_[i], i});
    }
    return best.block;
  }

 private:
  struct Candidate {
    double start = std::numeric_limits<double>::infinity();
    double prio = 0;
    int block = -1;
    friend bool operator<(const Candidate& a, const Candidate& b) {
      if (b.block < 0) return a.block >= 0;
      if (a.block < 0) return false;
      if (a.start < b.start - kEps) return true;
      if (a.start > b.start + kEps) return false;
      return a.prio != b.prio ? a.prio < b.prio : a.block < b.block;
    }
  };
  struct Device {
    std::set<std::pair<double, int>> released[2];        // (priority, block)
    std::set<std::tuple<double, double, int>> later[2];  // (release, priority, block)
  };

  bool fits(const Block& b, size_t d) const {
    return pol_.memory_limit.empty() || b.memory <= 0 ||
           mem_[d] + b.memory <= pol_.memory_limit[d] + kEps;
  }

  Candidate best_on(size_t d) const {
    const Device& dev = devices_[d];
    Candidate best;
    // Released blocks all start when the device frees up: the first that fits, by priority.
    for (int allocates = 0; allocates < 2; ++allocates)
      for (const auto& [prio, i] : dev.released[allocates])
        if (fits(w_.block(i), d)) {
          best = std::min(best, Candidate{free_at_[d], prio, i});
          break;
        }
    if (best.block >= 0) return best;  // a later one starts later
    for (int allocates = 0; allocates < 2; ++allocates)
      for (const auto& [release, prio, i] : dev.later[allocates])
        if (fits(w_.block(i), d)) {
          best = std::min(best, Candidate{release, prio, i});
          break;
        }
    return best;
  }

  const Workload& w_;
  const ListPolicy& pol_;
  const std::vector<double>& ready_;
  const std::vector<double>& prio_;
  const std::vector<double>& free_at_;
  const std::vector<double>& mem_;
  std::vector<Device> devices_;
  std::vector<Candidate> best_on_;  // per device, best_on's answer unless changed_
  std::vector<char> changed_;
  std::vector<int> shared_;  // eligible blocks on several devices
};

}  // namespace

Result<std::vector<std::vector<int>>> list_schedule(const Workload& w, const ListPolicy& pol) {
  const int n = w.size();
  const int p = w.num_devices();
  std::vector<std::vector<int>> out_edges(n);
  std::vector<int> missing(n, 0);
  for (int i = 0; i < n; ++i) {
    missing[i] = static_cast<int>(w.deps(i).size());
    for (int d : w.deps(i)) out_edges[d].push_back(i);
  }
  std::vector<double> ready(n, 0), end(n, 0), prio(n, 0);
  for (int i = 0; i < n; ++i) prio[i] = pol.priority ? pol.priority(i) : i;
  std::vector<double> free_at(p, 0), mem(p, 0);
  Eligible eligible(w, pol, ready, prio, free_at, mem);
  // The blocks in the order they became eligible, for messages: those not yet placed are the
  // ones waiting (scanned only when nothing can start, so placing a block stays O(1)).
  std::vector<int> became_eligible;
  std::vector<char> placed(static_cast<size_t>(n), 0);
  for (int i = 0; i < n; ++i)
    if (!missing[i]) eligible.add(i), became_eligible.push_back(i);
  std::vector<std::vector<int>> order(p);
  auto shares = [&](int a, int b) {
    for (DeviceId d : w.block(a).devices)
      if (w.block(b).runs_on(d)) return true;
    return false;
  };
  for (int step = 0; step < n; ++step) {
    const int best = eligible.best();
    if (best < 0) {
      std::string names;
      int named = 0;
      for (size_t k = 0; k < became_eligible.size() && named < 4; ++k) {
        const int i = became_eligible[k];
        if (placed[static_cast<size_t>(i)]) continue;
        names += (named++ ? ", " : "") + w.block(i).id().to_string();
      }
      return error("no block can start within the memory limit (waiting: " + names + ")");
    }
    const Block& b = w.block(best);
    double start = ready[best];
    for (DeviceId d : b.devices) start = std::max(start, free_at[d.value()]);
    eligible.remove(best);
    placed[static_cast<size_t>(best)] = 1;
    end[best] = start + b.duration;
    for (DeviceId d : b.devices) {
      free_at[d.value()] = end[best];
      mem[d.value()] += b.memory;
      order[d.value()].push_back(best);
      eligible.advance(d);
    }
    for (int v : out_edges[best]) {
      double r = end[best] + (pol.comm_delay > 0 && !shares(best, v) ? pol.comm_delay : 0);
      ready[v] = std::max(ready[v], r);
      if (--missing[v] == 0) eligible.add(v), became_eligible.push_back(v);
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
