#include "scheduler/repetend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>

#include "scheduler/baseline.h"
#include "scheduler/list_scheduler.h"

namespace loom::sched {

namespace {

constexpr double kEps = 1e-9;

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

// The smallest factor that makes every span and the comm delay integral, so the search works
// on integer time slots (up to 1000; beyond that spans are rounded to 1/1000).
int64_t time_scale(const Placement& pl, double comm) {
  for (int64_t k = 1; k <= 1000; ++k) {
    auto integral = [k](double x) { return std::abs(x * k - std::round(x * k)) < 1e-7; };
    bool ok = integral(comm);
    for (const auto& b : pl.blocks()) ok = ok && integral(b.span);
    if (ok) return k;
  }
  return 1000;
}

// One instance's blocks in integer time units, and the branch and bound for a fixed period.
class ModuloSearch {
 public:
  ModuloSearch(const Placement& pl, int64_t scale, double comm, double limit, int64_t node_limit)
      : n_(static_cast<int>(pl.blocks().size())),
        p_(pl.num_devices()),
        limit_(limit),
        node_limit_(node_limit) {
    const auto& bl = pl.blocks();
    dur_.resize(n_);
    mem_.resize(n_);
    devs_.resize(n_);
    preds_.resize(n_);
    on_dev_.assign(p_, {});
    const int64_t c = static_cast<int64_t>(std::llround(comm * scale));
    for (int j = 0; j < n_; ++j) {
      dur_[j] = std::max<int64_t>(1, std::llround(bl[j].span * scale));
      mem_[j] = bl[j].memory;
      for (DeviceId d : bl[j].devices)
        devs_[j].push_back(static_cast<int>(d.value())), on_dev_[d.value()].push_back(j);
    }
    std::vector<std::vector<int>> succ(n_);
    for (int j = 0; j < n_; ++j)
      for (int u : bl[j].after) {
        bool share = false;
        for (int a : devs_[u])
          for (int b : devs_[j]) share = share || a == b;
        preds_[j].push_back({u, dur_[u] + (share ? 0 : c)});
        succ[u].push_back(j);
      }
    // ASAP times and topological order (placement validated: acyclic).
    asap_.assign(n_, 0);
    std::vector<int> indeg(n_, 0);
    for (int j = 0; j < n_; ++j) indeg[j] = static_cast<int>(preds_[j].size());
    std::vector<int> topo;
    for (int j = 0; j < n_; ++j)
      if (!indeg[j]) topo.push_back(j);
    for (size_t k = 0; k < topo.size(); ++k) {
      int u = topo[k];
      for (int v : succ[u]) {
        for (auto [x, lag] : preds_[v])
          if (x == u) asap_[v] = std::max(asap_[v], asap_[u] + lag);
        if (--indeg[v] == 0) topo.push_back(v);
      }
    }
    tail_.assign(n_, 0);
    for (int k = n_ - 1; k >= 0; --k) {
      int u = topo[k];
      tail_[u] = dur_[u];
      for (int v : succ[u])
        for (auto [x, lag] : preds_[v])
          if (x == u) tail_[u] = std::max(tail_[u], lag + tail_[v]);
    }
    critical_path_ = 0;
    for (int j = 0; j < n_; ++j) critical_path_ = std::max(critical_path_, asap_[j] + tail_[j]);
    ord_ = topo;
    std::stable_sort(ord_.begin(), ord_.end(), [&](int a, int b) { return asap_[a] < asap_[b]; });
    match_ = match_allocations();
    fully_matched_.assign(p_, 1);
    {
      std::vector<char> matched(n_, 0);
      for (int k = 0; k < n_; ++k)
        if (match_[k] >= 0) matched[k] = matched[match_[k]] = 1;
      for (int j = 0; j < n_; ++j)
        if (mem_[j] != 0 && !matched[j])
          for (int d : devs_[j]) fully_matched_[d] = 0;
    }
    for (int d = 0; d < p_; ++d) {
      int64_t load = 0;
      for (int j : on_dev_[d]) load += dur_[j];
      load_bound_ = std::max(load_bound_, load);
    }
  }

  int64_t period_lower_bound() const { return load_bound_; }
  int64_t critical_path() const { return critical_path_; }
  const std::vector<int>& order() const { return ord_; }
  int64_t duration(int j) const { return dur_[j]; }

  struct Outcome {
    bool found = false;
    bool exhausted = true;  // false when the node limit stopped the search
    bool memory_pruned = false;
    std::vector<int64_t> start;
    int64_t span = 0;
    int64_t nodes = 0;
  };

  Outcome run(int64_t T, int extra_periods) {
    T_ = T;
    extra_ = extra_periods;
    sigma_.assign(n_, kUnset);
    busy_.assign(p_, std::vector<char>(T, 0));
    left_on_dev_.assign(p_, 0);
    for (int d = 0; d < p_; ++d) left_on_dev_[d] = static_cast<int>(on_dev_[d].size());
    out_ = Outcome{};
    best_span_ = std::numeric_limits<int64_t>::max();
    min_start_ = 0;
    stop_ = false;
    phase_.assign(n_, -1);
    pre_branch(0);
    out_.exhausted = !hit_limit_;
    hit_limit_ = false;
    return out_;
  }

 private:
  static constexpr int64_t kUnset = std::numeric_limits<int64_t>::min();
  // Nodes spent shortening the instance span once a period is known feasible: the span only
  // breaks ties between repetends of the optimal period, so its search is budgeted.
  static constexpr int64_t kSpanBudget = 200'000;

  bool fits(int j, int64_t s) const {
    const int64_t ph = ((s % T_) + T_) % T_;
    for (int d : devs_[j])
      for (int64_t t = 0; t < dur_[j]; ++t)
        if (busy_[d][(ph + t) % T_]) return false;
    return true;
  }
  void mark(int j, int64_t s, char v) {
    const int64_t ph = ((s % T_) + T_) % T_;
    for (int d : devs_[j])
      for (int64_t t = 0; t < dur_[j]; ++t) busy_[d][(ph + t) % T_] = v;
  }
  // Whether device d's unplaced blocks (without a reserved phase) can still be packed into its
  // free slots: every block needs its own run of free slots, so for each duration D the blocks
  // at least D long must not outnumber the disjoint D-runs the free segments hold (exact for
  // spans 1 and 2), and the free time must cover their total.
  bool packs(int d) const {
    std::vector<int64_t> need;
    int64_t total = 0;
    for (int k : on_dev_[d])
      if (sigma_[k] == kUnset && phase_[k] < 0) need.push_back(dur_[k]), total += dur_[k];
    if (need.empty()) return true;
    const auto& b = busy_[d];
    std::vector<int64_t> segs;
    int64_t first_busy = -1;
    for (int64_t t = 0; t < T_; ++t)
      if (b[t]) {
        first_busy = t;
        break;
      }
    if (first_busy < 0) {
      segs.push_back(T_);
    } else {
      int64_t run = 0;
      for (int64_t k = 1; k <= T_; ++k) {
        int64_t t = (first_busy + k) % T_;
        if (b[t]) {
          if (run) segs.push_back(run);
          run = 0;
        } else {
          ++run;
        }
      }
    }
    int64_t free_total = 0;
    for (int64_t x : segs) free_total += x;
    if (total > free_total) return false;
    std::sort(need.begin(), need.end(), std::greater<int64_t>());
    for (size_t i = 0; i < need.size(); ++i) {
      if (i + 1 < need.size() && need[i + 1] == need[i]) continue;
      int64_t runs = 0;
      for (int64_t x : segs) runs += x / need[i];
      if (static_cast<int64_t>(i + 1) > runs) return false;  // blocks with span >= need[i]
    }
    return true;
  }

  // Reserves a phase for every multi-device block before the timing search: they are the most
  // constrained (free on all their devices at once), and knowing their slots early lets the
  // single-device blocks see the true free slots.
  void pre_branch(size_t i) {
    if (stop_) return;
    while (i < ord_.size() && devs_[ord_[i]].size() < 2) ++i;
    if (i == ord_.size()) {
      for (int d = 0; d < p_; ++d)
        if (!packs(d)) return;
      dfs(0);
      return;
    }
    const int j = ord_[i];
    const int64_t last = i == 0 ? 0 : T_ - 1;  // the first block starts at 0 (time shift)
    for (int64_t ph = 0; ph <= last && !stop_; ++ph) {
      if (++out_.nodes > node_limit_) {
        hit_limit_ = stop_ = true;
        return;
      }
      if (!fits(j, ph)) continue;
      mark(j, ph, 1);
      phase_[j] = ph;
      pre_branch(i + 1);
      phase_[j] = -1;
      mark(j, ph, 0);
    }
  }

  // Steady-state peak memory of device d with event times e_j; unplaced blocks use `lb`.
  double steady_peak(int d, const std::vector<int64_t>* lb) const {
    std::vector<std::pair<int64_t, double>> ev;
    for (int j : on_dev_[d]) {
      if (mem_[j] == 0) continue;
      int64_t s = sigma_[j] != kUnset ? sigma_[j] : (*lb)[j];
      ev.push_back({mem_[j] > 0 ? s : s + dur_[j], mem_[j]});
    }
    double peak = 0;
    for (const auto& [x, unused] : ev) {
      double m = 0;
      for (const auto& [e, delta] : ev) m += delta * static_cast<double>(floor_div(x - e, T_));
      peak = std::max(peak, m);
    }
    return peak;
  }
  // Earliest starts of the unplaced blocks given the placed ones: after their dependencies and
  // at a phase where their devices are still free. False when some block has no free phase.
  bool lower_bounds(std::vector<int64_t>& lb) const {
    lb.assign(n_, 0);
    for (int j : ord_) {
      if (sigma_[j] != kUnset) {
        lb[j] = sigma_[j];
        continue;
      }
      int64_t e = preds_[j].empty() ? min_start_ - T_ * (1 + extra_) + 1 : min_start_;
      for (auto [u, lag] : preds_[j]) e = std::max(e, lb[u] + lag);
      int64_t t = e;
      if (phase_[j] >= 0)
        t = e + (((phase_[j] - e) % T_) + T_) % T_;
      else
        while (t < e + T_ && !fits(j, t)) ++t;
      if (t == e + T_) return false;
      lb[j] = t;
    }
    return true;
  }

  // Pairs every freeing block with an allocating ancestor on the same device of equal size;
  // match[k] = j (for a free k) or -1. A placed pair's memory lives from e_j to e_k.
  std::vector<int> match_allocations() const {
    std::vector<int> match(n_, -1);
    std::vector<char> used(n_, 0);
    for (int k : ord_) {
      if (mem_[k] >= 0) continue;
      // Ancestors of k, nearest first (BFS backwards).
      std::vector<int> queue = {k};
      std::vector<char> seen(n_, 0);
      seen[k] = 1;
      for (size_t q = 0; q < queue.size() && match[k] < 0; ++q) {
        for (auto [u, lag] : preds_[queue[q]]) {
          if (seen[u]) continue;
          seen[u] = 1;
          queue.push_back(u);
          if (!used[u] && mem_[u] == -mem_[k] && devs_[u] == devs_[k]) {
            match[k] = u, used[u] = 1;
            break;
          }
        }
      }
    }
    return match;
  }

  // A lower bound on device d's steady peak with some blocks unplaced: an allocation whose
  // matched free is unplaced counts until the free's earliest end; a pair with both ends
  // unplaced holds memory >= 0 and is left out. Only for devices whose blocks all pair up.
  double pair_bound_peak(int d, const std::vector<int64_t>& lb) const {
    if (!fully_matched_[d]) return 0;
    std::vector<std::pair<int64_t, double>> ev;
    std::vector<char> counted(n_, 0);
    for (int k : on_dev_[d]) {
      if (mem_[k] >= 0) continue;
      const int j = match_[k];
      const bool k_placed = sigma_[k] != kUnset;
      if (sigma_[j] == kUnset) continue;
      counted[j] = 1;
      ev.push_back({sigma_[j], mem_[j]});
      ev.push_back({(k_placed ? sigma_[k] : lb[k]) + dur_[k], mem_[k]});
    }
    double peak = 0;
    for (const auto& [x, unused] : ev) {
      double m = 0;
      for (const auto& [e, delta] : ev) m += delta * static_cast<double>(floor_div(x - e, T_));
      peak = std::max(peak, m);
    }
    return peak;
  }

  void dfs(int depth) {
    if (stop_) return;
    if (depth == n_) {
      int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
      for (int j = 0; j < n_; ++j)
        lo = std::min(lo, sigma_[j]), hi = std::max(hi, sigma_[j] + dur_[j]);
      if (hi - lo < best_span_) {
        best_span_ = hi - lo;
        if (!out_.found) span_budget_end_ = out_.nodes + kSpanBudget;

        out_.found = true;
        out_.span = best_span_;
        out_.start = sigma_;
        for (auto& s : out_.start) s -= lo;
        if (best_span_ <= critical_path_) stop_ = true;  // provably shortest
      }
      return;
    }
    const int j = ord_[depth];
    const int64_t window = mem_[j] > 0 ? T_ * (1 + extra_) : T_;
    int64_t lo, hi;
    if (depth == 0) {
      lo = hi = 0;  // a global time shift changes nothing
    } else if (preds_[j].empty()) {
      lo = -window + 1, hi = window - 1;  // another source: any phase and offset
    } else {
      lo = std::numeric_limits<int64_t>::min();
      for (auto [u, lag] : preds_[j]) lo = std::max(lo, sigma_[u] + lag);
      hi = lo + window - 1;
    }
    // Values in increasing order; a further source nearest to the first block first (its
    // offset in either direction is symmetric, and a small one keeps the span short).
    const bool source = depth > 0 && preds_[j].empty();
    for (int64_t i = 0; i <= hi - lo && !stop_; ++i) {
      const int64_t s = source ? (i % 2 ? (i + 1) / 2 : -(i / 2)) : lo + i;
      if (s < lo || s > hi) continue;
      if (s + tail_[j] - std::min(min_start_, s) >= best_span_) {
        if (source) continue;
        break;
      }
      if (++out_.nodes > node_limit_ || (out_.found && out_.nodes > span_budget_end_)) {
        hit_limit_ = stop_ = true;
        return;
      }
      const bool reserved = phase_[j] >= 0;
      if (reserved ? (((s % T_) + T_) % T_) != phase_[j] : !fits(j, s)) continue;
      sigma_[j] = s;
      if (!reserved) mark(j, s, 1);
      const int64_t saved_min = min_start_;
      min_start_ = std::min(min_start_, s);
      if (feasible_after(j)) dfs(depth + 1);
      min_start_ = saved_min;
      if (!reserved) mark(j, s, 0);
      sigma_[j] = kUnset;
      for (int d : devs_[j]) ++left_on_dev_[d];
    }
  }

  // Counts the block just placed and prunes: packing on its devices, a free phase for every
  // unplaced block, the span bound, and memory on every device.
  bool feasible_after(int j) {
    bool ok = true;
    for (int d : devs_[j]) --left_on_dev_[d];
    for (int d : devs_[j]) {
      if (!ok) break;
      if (left_on_dev_[d] > 0 && !packs(d)) ok = false;
    }
    if (!ok) return false;
    std::vector<int64_t> lb;
    if (!lower_bounds(lb)) return false;
    // Span bound: every unplaced block still has its tail to run.
    int64_t lo = min_start_, hi = 0;
    for (int k = 0; k < n_; ++k) lo = std::min(lo, lb[k]), hi = std::max(hi, lb[k] + tail_[k]);
    if (hi - lo >= best_span_) return false;
    if (limit_ == Placement::kNoLimit) return true;
    // Memory: exact once a device is complete, else a lower bound (pair_bound_peak).
    for (int d = 0; d < p_ && ok; ++d) {
      if (left_on_dev_[d] == static_cast<int>(on_dev_[d].size())) continue;
      const bool touched = std::find(devs_[j].begin(), devs_[j].end(), d) != devs_[j].end();
      if (left_on_dev_[d] == 0) {
        if (touched && steady_peak(d, nullptr) > limit_ + kEps) ok = false;
        continue;
      }
      if (pair_bound_peak(d, lb) > limit_ + kEps) ok = false;
    }
    if (!ok) out_.memory_pruned = true;
    return ok;
  }

  int n_, p_;
  double limit_;
  int64_t node_limit_;
  std::vector<int64_t> dur_;
  std::vector<double> mem_;
  std::vector<std::vector<int>> devs_;
  std::vector<std::vector<std::pair<int, int64_t>>> preds_;
  std::vector<std::vector<int>> on_dev_;
  std::vector<int64_t> asap_, tail_;
  std::vector<int> ord_, match_;
  std::vector<char> fully_matched_;
  int64_t critical_path_ = 0, load_bound_ = 0;
  // Search state.
  int64_t T_ = 1;
  int extra_ = 0;
  std::vector<int64_t> sigma_, phase_;
  std::vector<std::vector<char>> busy_;
  std::vector<int> left_on_dev_;  // unplaced blocks per device
  Outcome out_;
  int64_t best_span_ = 0, min_start_ = 0;
  bool stop_ = false, hit_limit_ = false;
  int64_t span_budget_end_ = 0;
};

double steady_memory(const Placement& pl, const std::vector<double>& start, double T, int d) {
  std::vector<std::pair<double, double>> ev;
  for (size_t j = 0; j < pl.blocks().size(); ++j) {
    const auto& b = pl.blocks()[j];
    if (b.memory == 0 ||
        std::find(b.devices.begin(), b.devices.end(), DeviceId(d)) == b.devices.end())
      continue;
    ev.push_back({b.memory > 0 ? start[j] : start[j] + b.span, b.memory});
  }
  double peak = 0;
  for (const auto& x : ev) {
    double m = 0;
    for (const auto& e : ev) m += e.second * std::floor((x.first - e.first) / T + kEps);
    peak = std::max(peak, m);
  }
  return peak;
}

}  // namespace

double Repetend::bubble_ratio(const Placement& pl) const {
  double busy = 0;
  for (int d = 0; d < pl.num_devices(); ++d) busy += pl.load(DeviceId(d));
  return period > 0 ? 1.0 - busy / (pl.num_devices() * period) : 0.0;
}

std::string Repetend::to_string(const Placement& pl) const {
  std::ostringstream os;
  os << "repetend: period " << period << " (lower bound " << period_lower_bound << "), spans "
     << instances_spanned << " instance(s), instance span " << span << "\n";
  for (size_t j = 0; j < start.size(); ++j)
    os << "  " << pl.blocks()[j].name << " @" << start[j] << " offset " << offset[j] << "\n";
  return os.str();
}

Result<Repetend> find_repetend(const Placement& pl, const SearchOptions& opt) {
  LOOM_TRY(pl.validate());
  const double limit = opt.memory_limit ? *opt.memory_limit : pl.memory_limit();
  if (!(limit > 0)) return Error::at("mem-limit", "the memory limit must be positive");
  if (opt.comm_delay < 0) return Error::at("comm", "the communication delay must not be negative");
  const int64_t scale = time_scale(pl, opt.comm_delay);
  ModuloSearch search(pl, scale, opt.comm_delay, limit, opt.node_limit);
  const int64_t lb = search.period_lower_bound();
  // Past the critical path instances no longer overlap; beyond that only memory inside one
  // instance can fail, which a longer period does not fix.
  int64_t total = 0;
  for (size_t j = 0; j < pl.blocks().size(); ++j) total += search.duration(static_cast<int>(j));
  const int64_t hi = std::max(lb, total + search.critical_path());
  Repetend r;
  r.period_lower_bound = static_cast<double>(lb) / scale;
  for (int64_t T = lb; T <= hi; ++T) {
    auto out = search.run(T, 0);

    r.nodes += out.nodes;
    if (!out.found && opt.extra_delay_periods > 0 && (out.memory_pruned || !out.exhausted)) {
      bool exhausted = out.exhausted;
      out = search.run(T, opt.extra_delay_periods);
      r.nodes += out.nodes;
      out.exhausted = out.exhausted && exhausted;
    }
    if (!out.found) {
      if (!out.exhausted) r.period_optimal = false;
      continue;
    }
    r.span_optimal = out.exhausted;
    r.period = static_cast<double>(T) / scale;
    r.span = static_cast<double>(out.span) / scale;
    r.start.resize(out.start.size());
    r.offset.resize(out.start.size());
    for (size_t j = 0; j < out.start.size(); ++j) {
      r.start[j] = static_cast<double>(out.start[j]) / scale;
      r.offset[j] = static_cast<int>(floor_div(out.start[j], T));
      r.instances_spanned = std::max(r.instances_spanned, r.offset[j] + 1);
    }
    for (int d = 0; d < pl.num_devices(); ++d)
      r.steady_memory.push_back(steady_memory(pl, r.start, r.period, d));
    return r;
  }
  std::ostringstream os;
  os << "no repetend keeps every device within the memory limit " << limit
     << "; one micro-batch alone needs more on some device";
  return Error::at("mem-limit", os.str());
}

namespace {

// Ways to order the unrolled blocks, by name ("modulo", "list", "baseline-1f1b", ...+justified).
using Candidates = std::vector<std::pair<std::string, std::vector<std::vector<int>>>>;

// Planned start of every unrolled block: instance k runs block j at start_j + k * period.
std::vector<double> planned_starts(const Placement& pl, const Repetend& r, int instances,
                                   const Workload& w) {
  const int nb = static_cast<int>(pl.blocks().size());
  std::vector<double> planned(w.size());
  for (int k = 0; k < instances; ++k)
    for (int j = 0; j < nb; ++j) planned[pl.unrolled_index(k, j)] = r.start[j] + k * r.period;
  return planned;
}

// The modulo schedule itself, and for workloads small enough to refine, list scheduling by
// planned start, the baseline rules' schedules and the double justification of each.
Candidates completion_candidates(const Placement& pl, const Workload& w,
                                 const std::vector<double>& planned, int instances, double limit,
                                 const SearchOptions& opt) {
  const int p = pl.num_devices();
  auto earlier = [&](int a, int b) {
    return planned[a] != planned[b] ? planned[a] < planned[b] : a < b;
  };
  Candidates candidates;
  {  // The modulo schedule itself: every device in planned order.
    std::vector<std::vector<int>> order(p);
    for (int d = 0; d < p; ++d) {
      order[d] = w.blocks_on(DeviceId(d));
      std::sort(order[d].begin(), order[d].end(), earlier);
    }
    candidates.push_back({"modulo", std::move(order)});
  }
  // List scheduling costs O(blocks x micro-batches); past kListBlocks blocks the warm-up and
  // cool-down are a vanishing share of the makespan and the unrolled repetend alone is used.
  constexpr int kListBlocks = 50'000;
  if (w.size() > kListBlocks) return candidates;
  {  // List scheduling by planned start: warm-up and cool-down fill what the pattern leaves idle.
    ListPolicy pol;
    pol.priority = [&](int i) { return planned[i]; };
    if (limit != Placement::kNoLimit) pol.memory_limit.assign(p, limit);
    pol.comm_delay = opt.comm_delay;
    auto order = list_schedule(w, pol);
    if (order.ok()) candidates.push_back({"list", std::move(order).value()});
  }
  // The baseline rules' schedules (baseline.h) compete as well: for few micro-batches per
  // device a repetend's steady state matters less than a tight warm-up, and the search promises
  // never to return something worse than a predefined schedule that fits.
  for (auto& b : baselines(pl, instances * pl.micro_batches_per_instance(), limit,
                           SimOptions{opt.comm_delay, {}}))
    candidates.push_back({"baseline-" + b.name, b.schedule.order()});
  {  // Double justification of all, which shortens warm-up and cool-down further.
    ListPolicy limits;
    if (limit != Placement::kNoLimit) limits.memory_limit.assign(p, limit);
    limits.comm_delay = opt.comm_delay;
    const size_t base = candidates.size();
    for (size_t c = 0; c < base; ++c)
      candidates.push_back(
          {candidates[c].first + "+justified", justify(w, candidates[c].second, limits)});
  }
  return candidates;
}

// The candidate with the shortest makespan within the memory limit (the first of equals).
SearchResult best_candidate(const Workload& w, Candidates candidates, const Repetend& r,
                            double limit, const SearchOptions& opt) {
  std::optional<SearchResult> best;
  std::string last_error;
  for (auto& [name, order] : candidates) {
    auto s = Schedule::from_indices(w, std::move(order), "search");
    if (!s.ok()) {
      last_error = s.error().message;
      continue;
    }
    auto t = simulate(*s, SimOptions{opt.comm_delay, {}});
    if (!t.ok()) {
      last_error = t.error().message;
      continue;
    }
    if (t->max_peak_memory() > limit + kEps) {
      last_error = "over the memory limit";
      continue;
    }
    if (best && t->makespan >= best->timeline.makespan - kEps) continue;
    SearchResult res;
    res.repetend = r;
    res.schedule = std::move(s).value();
    res.timeline = std::move(t).value();
    res.completion = name;
    best = std::move(res);
  }
  LOOM_CHECK(best.has_value()) << "the modulo schedule of a feasible repetend must be valid: "
                               << last_error;
  return std::move(*best);
}

// Warm-up: until the first complete repetend window starts; cool-down: after the last ends.
void measure_warmup_cooldown(const Placement& pl, const Repetend& r, int instances,
                             SearchResult& res) {
  const int nb = static_cast<int>(pl.blocks().size());
  const int S = r.instances_spanned;
  res.repetend_instances = std::max(0, instances - S + 1);
  if (res.repetend_instances == 0) {
    res.warmup = res.timeline.makespan;
    res.cooldown = 0;
    return;
  }
  double first = std::numeric_limits<double>::infinity(), last = 0;
  for (int j = 0; j < nb; ++j) {
    first = std::min(first, res.timeline.start[pl.unrolled_index(S - 1 - r.offset[j], j)]);
    last = std::max(last, res.timeline.end[pl.unrolled_index(instances - 1 - r.offset[j], j)]);
  }
  res.warmup = first;
  res.cooldown = res.timeline.makespan - last;
}

}  // namespace

Result<SearchResult> complete_repetend(const Placement& pl, const Repetend& r, int instances,
                                       const SearchOptions& opt) {
  const double limit = opt.memory_limit ? *opt.memory_limit : pl.memory_limit();
  LOOM_ASSIGN_OR_RETURN(Workload w, pl.unroll(instances));
  const std::vector<double> planned = planned_starts(pl, r, instances, w);
  SearchResult res = best_candidate(w, completion_candidates(pl, w, planned, instances, limit, opt),
                                    r, limit, opt);
  measure_warmup_cooldown(pl, r, instances, res);
  return res;
}

Result<SearchResult> search_schedule(const Placement& pl, int micro_batches,
                                     const SearchOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  const int per = pl.micro_batches_per_instance();
  if (micro_batches < 1 || micro_batches % per != 0)
    return Error::at("micro-batches",
                     "this placement runs " + std::to_string(per) +
                         " micro-batches per instance; m must be a positive multiple of " +
                         std::to_string(per) + ", got " + std::to_string(micro_batches));
  LOOM_ASSIGN_OR_RETURN(Repetend r, find_repetend(pl, opt));
  const auto t1 = std::chrono::steady_clock::now();
  LOOM_ASSIGN_OR_RETURN(SearchResult res, complete_repetend(pl, r, micro_batches / per, opt));
  res.repetend_time_s = std::chrono::duration<double>(t1 - t0).count();
  res.search_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

namespace {

// The exact bits of every input search_schedule reads, as a map key: a double's bits, not its
// decimal rounding, so only equal inputs meet.
class KeyWriter {
 public:
  KeyWriter& operator<<(double v) {
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    return *this << static_cast<int64_t>(bits);
  }
  KeyWriter& operator<<(int64_t v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  KeyWriter& operator<<(const std::string& v) {
    *this << static_cast<int64_t>(v.size());
    out_ += v;
    return *this;
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string search_key(const Placement& placement, int micro_batches,
                       const SearchOptions& options) {
  KeyWriter k;
  k << static_cast<int64_t>(micro_batches) << static_cast<int64_t>(placement.num_devices())
    << placement.memory_limit() << static_cast<int64_t>(options.memory_limit.has_value())
    << options.memory_limit.value_or(0.0) << options.comm_delay << options.node_limit
    << static_cast<int64_t>(options.extra_delay_periods)
    << static_cast<int64_t>(placement.blocks().size());
  for (const PlacedBlock& b : placement.blocks()) {
    k << b.name << static_cast<int64_t>(b.kind) << static_cast<int64_t>(b.stage.value())
      << static_cast<int64_t>(b.micro_batch) << b.span << b.memory
      << static_cast<int64_t>(b.devices.size());
    for (const DeviceId& d : b.devices) k << static_cast<int64_t>(d.value());
    k << static_cast<int64_t>(b.after.size());
    for (int a : b.after) k << static_cast<int64_t>(a);
  }
  return k.take();
}

}  // namespace

Result<SearchResult> SearchMemo::search(const Placement& placement, int micro_batches,
                                        const SearchOptions& options) {
  const std::string key = search_key(placement, micro_batches, options);
  {
    std::lock_guard<std::mutex> guard(mutex_);
    auto it = found_.find(key);
    if (it != found_.end()) return it->second;
  }
  // Searched outside the lock: two threads with the same input both search it (the search is
  // deterministic, so whichever result is kept is the same).
  Result<SearchResult> found = search_schedule(placement, micro_batches, options);
  std::lock_guard<std::mutex> guard(mutex_);
  return found_.emplace(key, std::move(found)).first->second;
}

int64_t SearchMemo::searches() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return static_cast<int64_t>(found_.size());
}

}  // namespace loom::sched
