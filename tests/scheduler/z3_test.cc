// Cross-check of the repetend period against Z3 (Tessel's formulation: start times, cyclic
// non-overlap per device, steady memory with integer division), on small placements.
#include <gtest/gtest.h>
#include <z3++.h>

#include "scheduler/repetend.h"

namespace loom::sched {
namespace {

// Smallest period Z3 finds satisfiable, from the per-device work bound up (integer spans).
int z3_period(const Placement& pl, double limit) {
  const auto& bl = pl.blocks();
  const int n = static_cast<int>(bl.size());
  int lb = 0, total = 0;
  for (int d = 0; d < pl.num_devices(); ++d)
    lb = std::max(lb, static_cast<int>(pl.load(DeviceId(d))));
  for (const auto& b : bl) total += static_cast<int>(b.span);
  for (int T = lb; T <= lb + 12; ++T) {
    z3::context c;
    z3::solver s(c);
    std::vector<z3::expr> st;
    for (int j = 0; j < n; ++j) {
      st.push_back(c.int_const(("s" + std::to_string(j)).c_str()));
      s.add(st[j] >= -4 * T && st[j] <= n * T + total);
    }
    s.add(st[0] == 0);
    for (int j = 0; j < n; ++j)
      for (int u : bl[j].after) s.add(st[j] >= st[u] + static_cast<int>(bl[u].span));
    for (int d = 0; d < pl.num_devices(); ++d) {
      std::vector<int> on;
      for (int j = 0; j < n; ++j)
        if (std::count(bl[j].devices.begin(), bl[j].devices.end(), DeviceId(d))) on.push_back(j);
      for (size_t a = 0; a < on.size(); ++a)
        for (size_t b = a + 1; b < on.size(); ++b) {
          z3::expr gap = z3::mod(st[on[b]] - st[on[a]], c.int_val(T));
          s.add(gap >= static_cast<int>(bl[on[a]].span) &&
                gap <= T - static_cast<int>(bl[on[b]].span));
        }
      std::vector<std::pair<z3::expr, int>> ev;
      for (int j : on)
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
    if (s.check() == z3::sat) return T;
  }
  return -1;
}

TEST(SearchZ3, PeriodMatchesZ3) {
  struct Case {
    Placement pl;
    double limit;
  };
  std::vector<Case> cases;
  for (double limit : {1.0, 2.0, 3.0}) cases.push_back({Placement::v_shape(3), limit});
  for (double limit : {2.0, 4.0}) cases.push_back({Placement::k_shape(4), limit});
  cases.push_back({Placement::x_shape(2), 2.0});
  cases.push_back({Placement::v_shape(4), 4.0});
  for (const auto& c : cases) {
    SearchOptions opt;
    opt.memory_limit = c.limit;
    auto r = find_repetend(c.pl, opt);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_EQ(r->period, z3_period(c.pl, c.limit)) << c.pl.to_yaml() << "limit " << c.limit;
  }
}

}  // namespace
}  // namespace loom::sched
