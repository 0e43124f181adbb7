#include "scheduler/baseline.h"

#include <algorithm>

#include "scheduler/list_scheduler.h"
#include "scheduler/predefined.h"
#include "scheduler/validator.h"

namespace loom::sched {

std::vector<Baseline> baselines(const Placement& pl, int m, double limit, const SimOptions& opt) {
  std::vector<Baseline> out;
  const int per = pl.micro_batches_per_instance();
  if (m < 1 || m % per != 0) return out;
  auto w = pl.unroll(m / per);
  if (!w.ok()) return out;
  const int p = pl.num_devices();
  auto add = [&](const std::string& name, Result<std::vector<std::vector<int>>> order) {
    if (!order.ok()) return;
    auto s = Schedule::from_indices(*w, std::move(order).value(), name);
    if (!s.ok()) return;
    auto t = simulate(*s, opt);
    if (!t.ok() || t->max_peak_memory() > limit + 1e-9) return;
    out.push_back(Baseline{name, std::move(s).value(), std::move(t).value()});
  };
  {  // GPipe: forwards of every micro-batch, then backwards, micro-batch by micro-batch.
    std::vector<std::vector<int>> order(p);
    for (int d = 0; d < p; ++d) {
      auto blocks = w->blocks_on(DeviceId(d));
      std::stable_sort(blocks.begin(), blocks.end(), [&](int a, int b) {
        bool ba = is_backward(w->block(a).kind), bb = is_backward(w->block(b).kind);
        if (ba != bb) return !ba;
        return w->block(a).mb < w->block(b).mb;
      });
      order[d] = blocks;
    }
    add("gpipe", order);
  }
  ListPolicy pol;
  pol.priority = [&](int i) {
    const Block& b = w->block(i);
    return (is_backward(b.kind) ? 0.0 : 1e9) + b.mb.value() * 1e3 + (i % 1000) * 1e-3;
  };
  pol.comm_delay = opt.comm_delay;
  add("chimera", list_schedule(*w, pol));  // backward first, no memory cap
  if (limit != Placement::kNoLimit) {
    pol.memory_limit.assign(p, limit);
    add("1f1b", list_schedule(*w, pol));  // backward first, forwards within the memory limit
  }
  const bool split = std::any_of(w->blocks().begin(), w->blocks().end(),
                                 [](const Block& b) { return b.kind == BlockKind::kW; });
  if (split) {
    // The zero-bubble rule: I (or B) first, then forwards within the memory limit, W last: a W
    // waits until a device would otherwise idle or needs the memory it frees (the bubbles).
    ListPolicy zb = pol;
    zb.priority = [&](int i) {
      const Block& b = w->block(i);
      const double rank = b.kind == BlockKind::kW ? 2e9 : b.kind == BlockKind::kF ? 1e9 : 0.0;
      return rank + b.mb.value() * 1e3 + (i % 1000) * 1e-3;
    };
    add("zb", list_schedule(*w, zb));
    // ZB-H1's own order where the placement is its chain (stage d alone on device d); other
    // placements fail to resolve (unknown or misplaced blocks) and keep the rule above only.
    if (auto ids = device_orders(ScheduleKind::kZbH1, p, m); ids.ok())
      add("zb-h1", resolve_order(*w, *ids));
  }
  return out;
}

Result<Baseline> best_baseline(const Placement& pl, int m, const SimOptions& opt) {
  auto all = baselines(pl, m, pl.memory_limit(), opt);
  if (all.empty()) return error("no baseline schedule fits the memory limit");
  auto best = std::min_element(all.begin(), all.end(), [](const Baseline& a, const Baseline& b) {
    return a.makespan() < b.makespan();
  });
  return *best;
}

}  // namespace loom::sched
