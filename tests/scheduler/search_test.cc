// The repetend search: optimal periods and makespans (against exhaustive enumeration on tiny
// cases), 1F1B's steady state on the V-shape, never worse than the predefined schedules, and
// within the memory limit at every instant.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>

#include "scheduler/baseline.h"
#include "scheduler/predefined.h"
#include "scheduler/repetend.h"

namespace loom::sched {
namespace {

constexpr double kTol = 1e-9;

SearchResult search(const Placement& pl, int m, double limit) {
  SearchOptions opt;
  opt.memory_limit = limit;
  auto r = search_schedule(pl, m, opt);
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return r.ok() ? std::move(r).value() : SearchResult{};
}

void expect_within_memory(const SearchResult& r, double limit) {
  for (const auto& trace : r.timeline.memory_trace)
    for (const auto& point : trace) EXPECT_LE(point.memory, limit + kTol) << "at t=" << point.time;
  EXPECT_LE(r.timeline.max_peak_memory(), limit + kTol);
}

// ---- exhaustive references -------------------------------------------------------------------

// Smallest makespan over every per-device order of the workload within the memory limit.
double exhaustive_makespan(const Workload& w, double limit) {
  const int p = w.num_devices();
  std::vector<std::vector<std::vector<int>>> per_device(p);
  for (int d = 0; d < p; ++d) {
    std::vector<int> blocks = w.blocks_on(DeviceId(d));
    // Linear extensions of the device's blocks under same-device dependencies (transitive).
    std::function<bool(int, int)> reaches = [&](int from, int to) {
      for (int dep : w.deps(to))
        if (dep == from || reaches(from, dep)) return true;
      return false;
    };
    std::sort(blocks.begin(), blocks.end());
    do {
      bool ok = true;
      for (size_t a = 0; a < blocks.size() && ok; ++a)
        for (size_t b = a + 1; b < blocks.size() && ok; ++b)
          if (reaches(blocks[b], blocks[a])) ok = false;
      if (ok && order_peak_memory(w, blocks) <= limit + kTol) per_device[d].push_back(blocks);
    } while (std::next_permutation(blocks.begin(), blocks.end()));
  }
  double best = std::numeric_limits<double>::infinity();
  std::vector<std::vector<int>> order(p);
  std::function<void(int)> rec = [&](int d) {
    if (d == p) {
      auto s = Schedule::from_indices(w, order);
      if (!s.ok()) return;  // deadlocks
      auto t = simulate(*s);
      if (t.ok()) best = std::min(best, t->makespan);
      return;
    }
    for (const auto& o : per_device[d]) {
      order[d] = o;
      rec(d + 1);
    }
  };
  rec(0);
  return best;
}

// Smallest period of a modulo schedule within the memory limit, by plain enumeration of start
// times (no pruning but device clashes).
double exhaustive_period(const Placement& pl, double limit, int max_extra = 40) {
  const auto& bl = pl.blocks();
  const int n = static_cast<int>(bl.size());
  int lb = 0;
  for (int d = 0; d < pl.num_devices(); ++d)
    lb = std::max(lb, static_cast<int>(pl.load(DeviceId(d))));
  for (int T = lb;; ++T) {
    std::vector<int> s(n, 0);
    std::vector<std::vector<int>> busy(pl.num_devices(), std::vector<int>(T, 0));
    auto occupy = [&](int k, int delta) {
      bool clash = false;
      for (DeviceId d : bl[k].devices)
        for (int t = 0; t < bl[k].span; ++t)
          clash |= (busy[d.value()][(s[k] + t) % T] += delta) > 1;
      return !clash;
    };
    bool found = false;
    std::function<void(int)> rec = [&](int j) {
      if (found) return;
      if (j == n) {
        for (int d = 0; d < pl.num_devices(); ++d) {
          // Steady memory: sum over events of delta * floor((x - e) / T).
          double peak = 0;
          for (int x = 0; x < T; ++x) {
            double m = 0;
            for (int k = 0; k < n; ++k) {
              if (!std::count(bl[k].devices.begin(), bl[k].devices.end(), DeviceId(d))) continue;
              int e = bl[k].memory > 0 ? s[k] : s[k] + static_cast<int>(bl[k].span);
              int q = x - e;
              m += bl[k].memory * ((q >= 0 ? q : q - T + 1) / T);
            }
            peak = std::max(peak, m);
          }
          if (peak > limit + kTol) return;
        }
        found = true;
        return;
      }
      int lo = 0;
      for (int a : bl[j].after) lo = std::max(lo, s[a] + static_cast<int>(bl[a].span));
      // Later than a period (two for an allocating block) only repeats a phase at more memory.
      const int box = bl[j].memory > 0 ? 2 * T : T;
      for (int v = lo; v < lo + box && !found; ++v) {
        s[j] = v;
        if (occupy(j, 1)) rec(j + 1);  // device exclusivity modulo T
        occupy(j, -1);
      }
    };
    rec(0);
    if (found) return T;
    if (T >= lb + max_extra) return -1;
  }
}

// ---- tests -----------------------------------------------------------------------------------

TEST(Search, VShapeFindsOneFOneBSteadyState) {
  for (int p : {2, 4, 8}) {
    auto r = find_repetend(Placement::v_shape(p), SearchOptions{});
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_EQ(r->period, 3) << "t_f + t_b";
    EXPECT_TRUE(r->period_optimal);
    EXPECT_NEAR(r->bubble_ratio(Placement::v_shape(p)), 0, kTol);
    for (int d = 0; d < p; ++d) EXPECT_NEAR(r->steady_memory[d], p - d, kTol) << "1F1B's memory";
    for (int m : {p, 2 * p, 3 * p}) {
      SearchResult s = search(Placement::v_shape(p), m, p);
      auto ref = simulate(*one_f_one_b(PipelineSpec::of(p, m)));
      EXPECT_NEAR(s.timeline.makespan, ref->makespan, kTol) << "p=" << p << " m=" << m;
      expect_within_memory(s, p);
    }
  }
}

TEST(Search, XShapeNeverWorseThanChimera) {
  for (int p : {2, 4, 6, 8})
    for (int m : {p, 2 * p}) {
      auto ch = chimera(PipelineSpec::of(p, m));
      ASSERT_TRUE(ch.ok());
      auto ref = simulate(*ch);
      const double limit = ref->max_peak_memory();
      SearchResult s = search(Placement::x_shape(p), m, limit);
      EXPECT_LE(s.timeline.makespan, ref->makespan + kTol) << "p=" << p << " m=" << m;
      EXPECT_EQ(s.repetend.period, 6) << "one pair per t_f+t_b on every device";
      expect_within_memory(s, limit);
    }
}

TEST(Search, MAndKNeverWorseThanBestBaselineThatFits) {
  for (int p : {2, 4, 8})
    for (int m : {p, 2 * p})
      for (auto make : {Placement::m_shape, Placement::k_shape}) {
        Placement pl = make(p, 1, 2);
        for (double limit : {static_cast<double>(p), std::max(2.0, p / 2.0)}) {
          auto bases = baselines(pl, m, limit);
          SearchOptions opt;
          opt.memory_limit = limit;
          auto s = search_schedule(pl, m, opt);
          if (!s.ok()) {
            EXPECT_TRUE(bases.empty()) << s.error().to_string();
            continue;
          }
          for (const auto& b : bases)
            EXPECT_LE(s->timeline.makespan, b.makespan() + kTol)
                << b.name << " p=" << p << " m=" << m;
          expect_within_memory(*s, limit);
        }
      }
}

TEST(Search, PeriodOptimalAgainstExhaustiveModuloEnumeration) {
  struct Case {
    Placement pl;
    double limit;
  };
  std::vector<Case> cases;
  for (double limit : {1.0, 2.0}) cases.push_back({Placement::v_shape(2), limit});
  for (double limit : {1.0, 2.0, 3.0}) cases.push_back({Placement::v_shape(3), limit});
  for (double limit : {2.0, 3.0}) cases.push_back({Placement::k_shape(3), limit});
  cases.push_back({Placement::x_shape(2), 2.0});
  for (const auto& c : cases) {
    SearchOptions opt;
    opt.memory_limit = c.limit;
    auto r = find_repetend(c.pl, opt);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_EQ(r->period, exhaustive_period(c.pl, c.limit)) << c.pl.to_yaml() << "limit " << c.limit;
  }
}

TEST(Search, MakespanOptimalAgainstExhaustiveSchedules) {
  struct Case {
    Placement pl;
    int m;
    double limit;
  };
  std::vector<Case> cases;
  for (int m : {1, 2, 3})
    for (double limit : {1.0, 2.0}) cases.push_back({Placement::v_shape(2), m, limit});
  for (double limit : {1.0, 2.0, 3.0}) cases.push_back({Placement::v_shape(3), 2, limit});
  cases.push_back({Placement::k_shape(3), 2, 2.0});
  cases.push_back({Placement::x_shape(2), 2, 2.0});
  for (const auto& c : cases) {
    const int per = c.pl.micro_batches_per_instance();
    auto w = c.pl.unroll(c.m / per);
    ASSERT_TRUE(w.ok());
    const double best = exhaustive_makespan(*w, c.limit);
    SearchResult s = search(c.pl, c.m, c.limit);
    EXPECT_NEAR(s.timeline.makespan, best, kTol)
        << c.pl.to_yaml() << "m=" << c.m << " limit " << c.limit;
    expect_within_memory(s, c.limit);
  }
}

TEST(Search, RespectsTheMemoryLimitAtEveryInstant) {
  for (double limit : {1.0, 2.0, 3.0, 4.0}) {
    SearchResult s = search(Placement::v_shape(4), 8, limit);
    expect_within_memory(s, limit);
    for (double m : s.repetend.steady_memory) EXPECT_LE(m, limit + kTol);
  }
  for (double limit : {2.0, 3.0, 4.0})
    expect_within_memory(search(Placement::x_shape(4), 8, limit), limit);
}

TEST(Search, SplitVShapeIsZbH1sPlacement) {
  const Placement pl = Placement::v_shape_split(3, 1, 2, 1);
  ASSERT_EQ(pl.blocks().size(), 9u);
  for (int d = 0; d < 3; ++d) {
    std::vector<BlockKind> kinds;
    for (const auto& b : pl.blocks())
      if (b.devices == std::vector<DeviceId>{DeviceId(d)}) kinds.push_back(b.kind);
    EXPECT_EQ(kinds, (std::vector<BlockKind>{BlockKind::kF, BlockKind::kI, BlockKind::kW}));
    EXPECT_EQ(pl.load(DeviceId(d)), 4);
  }
  // Only W frees the activations F took; I of the last stage follows its F.
  for (const auto& b : pl.blocks())
    EXPECT_EQ(b.memory, b.kind == BlockKind::kF ? 1 : b.kind == BlockKind::kW ? -1 : 0) << b.name;
  EXPECT_EQ(pl.blocks()[3].name, "i2");
  EXPECT_EQ(pl.blocks()[3].after, std::vector<int>{2});
  EXPECT_EQ(pl.blocks()[4].after, std::vector<int>{3});
}

// The search on ZB-H1's placement with 1F1B's memory (p micro-batches in flight) is never
// slower than ZB-H1 itself, at equal and at unequal I and W costs.
TEST(Search, SplitVShapeNoWorseThanZbH1) {
  const int p = 4, m = 8;
  for (auto [input, weight] : {std::pair{1.0, 1.0}, std::pair{2.0, 1.0}, std::pair{1.5, 0.5}}) {
    SearchResult s = search(Placement::v_shape_split(p, 1, input, weight), m, p);
    expect_within_memory(s, p);
    PipelineSpec spec = PipelineSpec::of(p, m);
    spec.fwd = 1, spec.bwd = input, spec.wgrad = weight;
    auto zb = zb_h1(spec);
    ASSERT_TRUE(zb.ok()) << zb.error().to_string();
    auto zt = simulate(*zb);
    ASSERT_TRUE(zt.ok()) << zt.error().to_string();
    EXPECT_LE(s.timeline.makespan, zt->makespan + kTol)
        << "I=" << input << " W=" << weight << " completion " << s.completion;
    EXPECT_NEAR(s.repetend.period, 1 + input + weight, kTol);  // no steady-state bubble
    // Every device runs F, I and W of every micro-batch.
    for (int d = 0; d < p; ++d) {
      std::map<BlockKind, int> count;
      for (int i : s.schedule.order()[d]) ++count[s.schedule.workload().block(i).kind];
      EXPECT_EQ(count[BlockKind::kF], m);
      EXPECT_EQ(count[BlockKind::kI], m);
      EXPECT_EQ(count[BlockKind::kW], m);
    }
    std::printf("v-split p=%d m=%d I=%g W=%g: search %g (%s), zb-h1 %g\n", p, m, input, weight,
                s.timeline.makespan, s.completion.c_str(), zt->makespan);
  }
}

TEST(Search, ErrorsNameTheProblem) {
  SearchOptions opt;
  opt.memory_limit = 0.5;
  auto r = search_schedule(Placement::v_shape(2), 4, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("memory limit"), std::string::npos) << r.error().message;
  auto x = search_schedule(Placement::x_shape(2), 3);
  ASSERT_FALSE(x.ok());
  EXPECT_NE(x.error().message.find("multiple of 2"), std::string::npos) << x.error().message;
}

TEST(Search, ProvesOptimalPeriodsOnTheBenchShapes) {
  // Speed is bench/schedule_search's business (timings are noisy here); what must hold on the
  // benchmark's shapes is that the search finishes its proof and respects the memory limit.
  for (int p : {4, 8})
    for (auto make :
         {Placement::v_shape, Placement::x_shape, Placement::m_shape, Placement::k_shape}) {
      SearchResult s = search(make(p, 1, 2), 2 * p, p);
      EXPECT_TRUE(s.repetend.period_optimal) << "p=" << p;
      EXPECT_LE(s.timeline.max_peak_memory(), p + 1e-9) << "p=" << p;
    }
}

}  // namespace
}  // namespace loom::sched

namespace loom::sched {
namespace {

// Random small placements (DAGs over 2-3 devices, some blocks on two devices, spans 1-2,
// allocate/free pairs): the period is the enumerated optimum and the schedule is valid and
// within memory.
TEST(Search, RandomPlacementsAgainstEnumeration) {
  uint64_t state = 12345;
  auto rnd = [&](int n) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int>((state >> 33) % n);
  };
  for (int trial = 0; trial < 40; ++trial) {
    const int devices = 2 + rnd(2);
    const int pairs = 2 + rnd(2);
    std::vector<PlacedBlock> blocks;
    // Forward blocks form a random DAG; each has a backward on its devices after it.
    for (int i = 0; i < pairs; ++i) {
      PlacedBlock f;
      f.name = "f" + std::to_string(i);
      f.kind = BlockKind::kF;
      f.stage = StageId(i);
      int d = rnd(devices);
      f.devices = {DeviceId(d)};
      if (rnd(4) == 0) f.devices.push_back(DeviceId((d + 1) % devices));
      f.span = 1 + rnd(2);
      f.memory = 1;
      if (i > 0) f.after = {rnd(i)};
      blocks.push_back(f);
    }
    for (int i = pairs - 1; i >= 0; --i) {
      PlacedBlock b = blocks[i];
      b.name = "b" + std::to_string(i);
      b.kind = BlockKind::kB;
      b.span = 1 + rnd(2);
      b.memory = -1;
      b.after = {i};
      if (i + 1 < pairs) b.after.push_back(static_cast<int>(blocks.size()) - 1);
      blocks.push_back(b);
    }
    auto pl = Placement::create(devices, Placement::kNoLimit, blocks);
    ASSERT_TRUE(pl.ok()) << pl.error().to_string();
    for (double limit : {1.0, 2.0}) {
      SearchOptions opt;
      opt.memory_limit = limit;
      auto r = find_repetend(*pl, opt);
      // Enumeration is slow past a few periods over the work bound: when loom finds no
      // repetend, check the first two periods; otherwise enumerate up to the period found.
      if (!r.ok()) {
        EXPECT_EQ(exhaustive_period(*pl, limit, 2), -1) << r.error().to_string() << "\n"
                                                        << pl->to_yaml();
        continue;
      }
      const double expected =
          exhaustive_period(*pl, limit, static_cast<int>(r->period - r->period_lower_bound) + 1);
      EXPECT_EQ(r->period, expected) << "trial " << trial << " limit " << limit << "\n"
                                     << pl->to_yaml();
      auto s = complete_repetend(*pl, *r, 3, opt);
      ASSERT_TRUE(s.ok()) << s.error().to_string();
      EXPECT_LE(s->timeline.max_peak_memory(), limit + kTol);
    }
  }
}

}  // namespace
}  // namespace loom::sched
