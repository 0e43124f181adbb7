// bench/schedule_search: time loom's repetend search on the V, X, M and K placements at
// p = 4, 8, 16 with a memory limit of p, and compare the found makespan with the best
// predefined schedule for the same placement, measured in the same run.
//
//   bench_schedule_search [--quick] [--micro-batches-factor F]   (m = F * p, default 2)
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "scheduler/baseline.h"
#include "scheduler/repetend.h"

using namespace loom::sched;

int main(int argc, char** argv) {
  bool quick = false;
  int factor = 2;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--micro-batches-factor") && i + 1 < argc) factor = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_schedule_search [--quick] [--micro-batches-factor F]\n");
      return 2;
    }
  }
  struct Shape {
    const char* name;
    Placement (*make)(int, double, double);
  };
  const Shape shapes[] = {{"V", Placement::v_shape}, {"X", Placement::x_shape},
                          {"M", Placement::m_shape}, {"K", Placement::k_shape}};
  std::vector<int> ps = quick ? std::vector<int>{4} : std::vector<int>{4, 8, 16};
  std::printf("%-5s %3s %4s %8s %10s %7s %10s %-14s %9s %7s %s\n", "shape", "p", "m", "period",
              "search_s", "nodes", "makespan", "baseline", "base_mk", "ratio", "target");
  int over = 0;
  for (int p : ps) {
    for (const auto& shape : shapes) {
      Placement pl = shape.make(p, 1, 2);
      pl.set_memory_limit(p);
      const int m = factor * p;
      auto res = search_schedule(pl, m);
      if (!res.ok()) {
        std::printf("%-5s %3d %4d search failed: %s\n", shape.name, p, m, res.error().to_string().c_str());
        ++over;
        continue;
      }
      auto base = best_baseline(pl, m);
      const double target = p <= 4 ? 0.1 : p <= 8 ? 1.0 : 10.0;
      const bool ok = res->search_time_s <= target;
      over += !ok;
      std::printf("%-5s %3d %4d %8g %10.4f %7lld %10g %-14s %9g %7.3f %s\n", shape.name, p, m,
                  res->repetend.period, res->search_time_s,
                  static_cast<long long>(res->repetend.nodes), res->timeline.makespan,
                  base.ok() ? base->name.c_str() : "-", base.ok() ? base->makespan() : 0.0,
                  base.ok() ? res->timeline.makespan / base->makespan() : 0.0,
                  ok ? "ok" : "OVER TARGET");
    }
  }
  return over ? 1 : 0;
}
