// bench/schedule_search: time loom's repetend search on the V, X, M and K placements at
// p = 4, 8, 16 with a memory limit of p. Baselines measured in the same run:
//   - makespan: the best predefined rule (baseline.h) that fits the same memory, for m = F*p;
//   - search time: Tessel's approach, Z3 over start times, on the same modulo formulation
//     (periods from the lower bound up; each check limited to --z3-timeout seconds).
//
//   bench_schedule_search [--quick] [--micro-batches-factor F] [--z3-max-p P] [--z3-timeout S]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "scheduler/baseline.h"
#include "scheduler/repetend.h"

#ifdef LOOM_HAVE_Z3
#include <z3++.h>
#endif

using namespace loom::sched;

namespace {

struct Z3Outcome {
  double seconds = 0;
  double period = 0;  // 0: not found within the time limit
};

#ifdef LOOM_HAVE_Z3
// The repetend problem for Z3 (integer spans): a start per block, dependencies, cyclic
// non-overlap per device, and steady memory sum_j mem_j * div(x - e_j, T) <= limit at every
// event x. Periods are tried from the lower bound upward, as loom's search does.
Z3Outcome z3_period(const Placement& pl, double limit, double timeout_s) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto& bl = pl.blocks();
  const int n = static_cast<int>(bl.size());
  int lb = 0, total = 0;
  for (int d = 0; d < pl.num_devices(); ++d)
    lb = std::max(lb, static_cast<int>(pl.load(loom::DeviceId(d))));
  for (const auto& b : bl) total += static_cast<int>(b.span);
  auto on = [&](int j, int d) {
    for (auto x : bl[j].devices)
      if (x.value() == d) return true;
    return false;
  };
  for (int T = lb; T <= 4 * lb + total; ++T) {
    const double left =
        timeout_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (left <= 0) return {timeout_s, 0};
    z3::context c;
    z3::solver s(c);
    z3::params params(c);
    params.set("timeout", static_cast<unsigned>(left * 1000));
    s.set(params);
    std::vector<z3::expr> st;
    for (int j = 0; j < n; ++j) {
      st.push_back(c.int_const(("s" + std::to_string(j)).c_str()));
      s.add(st[j] >= -2 * T && st[j] <= n * T + total);
    }
    s.add(st[0] == 0);
    for (int j = 0; j < n; ++j)
      for (int u : bl[j].after) s.add(st[j] >= st[u] + static_cast<int>(bl[u].span));
    for (int d = 0; d < pl.num_devices(); ++d) {
      std::vector<int> on_d;
      for (int j = 0; j < n; ++j)
        if (on(j, d)) on_d.push_back(j);
      for (size_t a = 0; a < on_d.size(); ++a)
        for (size_t b = a + 1; b < on_d.size(); ++b) {
          int j = on_d[a], k = on_d[b];
          z3::expr gap = z3::mod(st[k] - st[j], c.int_val(T));
          s.add(gap >= static_cast<int>(bl[j].span) && gap <= T - static_cast<int>(bl[k].span));
        }
      std::vector<std::pair<z3::expr, int>> ev;  // event time, memory change (integer units)
      for (int j : on_d)
        if (bl[j].memory != 0)
          ev.push_back({bl[j].memory > 0 ? st[j] : st[j] + static_cast<int>(bl[j].span),
                        static_cast<int>(bl[j].memory)});
      for (const auto& x : ev) {
        z3::expr m = c.int_val(0);
        for (const auto& e : ev)
          m = m + e.second * z3::expr(c, Z3_mk_div(c, x.first - e.first, c.int_val(T)));
        s.add(m <= static_cast<int>(limit));
      }
    }
    auto r = s.check();
    if (r == z3::sat) {
      return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              static_cast<double>(T)};
    }
    if (r == z3::unknown) return {timeout_s, 0};
  }
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0};
}
#endif

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int factor = 2, z3_max_p = 8;
  double z3_timeout = 20;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else if (!std::strcmp(argv[i], "--micro-batches-factor") && i + 1 < argc)
      factor = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--z3-max-p") && i + 1 < argc)
      z3_max_p = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--z3-timeout") && i + 1 < argc)
      z3_timeout = std::atof(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: bench_schedule_search [--quick] [--micro-batches-factor F] [--z3-max-p "
                   "P] [--z3-timeout S]\n");
      return 2;
    }
  }
  struct Shape {
    const char* name;
    Placement (*make)(int, double, double);
  };
  const Shape shapes[] = {{"V", Placement::v_shape},
                          {"X", Placement::x_shape},
                          {"M", Placement::m_shape},
                          {"K", Placement::k_shape}};
  std::vector<int> ps = quick ? std::vector<int>{4} : std::vector<int>{4, 8, 16};
  std::printf("%-3s %3s %4s %6s %4s %4s %9s %8s %8s %-24s %8s %6s %10s %8s %s\n", "sh", "p", "m",
              "period", "lb", "opt", "search_s", "nodes", "makespan", "won by", "base_mk", "ratio",
              "z3_s", "speedup", "target");
  int over = 0;
  for (int p : ps) {
    for (const auto& shape : shapes) {
      Placement pl = shape.make(p, 1, 2);
      pl.set_memory_limit(p);
      const int m = factor * p;
      auto res = search_schedule(pl, m);
      if (!res.ok()) {
        std::printf("%-3s %3d %4d search failed: %s\n", shape.name, p, m,
                    res.error().to_string().c_str());
        ++over;
        continue;
      }
      auto base = best_baseline(pl, m);
      const double target = p <= 4 ? 0.1 : p <= 8 ? 1.0 : 10.0;
      const bool ok = res->search_time_s <= target;
      over += !ok;
      std::string z3 = "-", speedup = "-";
#ifdef LOOM_HAVE_Z3
      if (p <= z3_max_p) {
        Z3Outcome zo = z3_period(pl, p, z3_timeout);
        char buf[64];
        std::snprintf(buf, sizeof buf, zo.period > 0 ? "%.3f" : ">%.0f", zo.seconds);
        z3 = buf;
        if (zo.period > 0 && zo.period != res->repetend.period)
          z3 += "(T=" + std::to_string(int(zo.period)) + "!)";
        std::snprintf(buf, sizeof buf, "%s%.0fx", zo.period > 0 ? "" : ">",
                      zo.seconds / std::max(res->repetend_time_s, 1e-6));
        speedup = buf;
      }
#endif
      std::printf("%-3s %3d %4d %6g %4g %4s %9.4f %8lld %8g %-24s %8g %6.3f %10s %8s %s\n",
                  shape.name, p, m, res->repetend.period, res->repetend.period_lower_bound,
                  res->repetend.period_optimal ? "yes" : "no", res->search_time_s,
                  static_cast<long long>(res->repetend.nodes), res->timeline.makespan,
                  res->completion.c_str(), base.ok() ? base->makespan() : 0.0,
                  base.ok() ? res->timeline.makespan / base->makespan() : 0.0, z3.c_str(),
                  speedup.c_str(), ok ? "ok" : "OVER TARGET");
    }
  }
  return over ? 1 : 0;
}
