#include "launch/plan_figures.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "planner/cost.h"

namespace loom::cli {
namespace {

// The seconds of the steps of `path` that `rank` takes part in (their alpha-beta cost from the
// path search) and the bytes it sends in them.
void path_share(const lower::CommPath& path, const Shape& shape, int64_t elem, int64_t rank,
                double times, RankFigures& out) {
  for (const lower::CommStep& st : path.steps) {
    bool in = false;
    for (DeviceId d : st.before.devices) in |= d.value() == rank;
    if (st.primitive == lower::Primitive::kSendRecv)
      for (const auto& pair : st.groups) in |= pair[0].value() == rank || pair[1].value() == rank;
    if (in) out.comm_s += st.cost_s;
  }
  add_path_bytes(path, shape, elem, rank, times, out.sent);
}

}  // namespace

double PlanFigures::max_peak_bytes() const {
  double m = 0;
  for (const auto& r : ranks) m = std::max(m, r.peak_bytes);
  return m;
}

PlanFigures plan_figures(const Config& config, const graph::Graph& planned,
                         const lower::Lowered& lowered, const std::vector<double>& peak_units,
                         double bubble_ratio, const lower::CostModel& cost) {
  const auto& par = config.parallel;
  const int64_t world = static_cast<int64_t>(lowered.programs.size());
  PlanFigures f;
  f.bubble_ratio = bubble_ratio;
  f.ranks.resize(static_cast<size_t>(world));
  std::vector<double> acts(static_cast<size_t>(world), 0), flops(static_cast<size_t>(world), 0);
  std::vector<std::set<std::string>> seen(static_cast<size_t>(world));
  for (const auto& op : planned.ops()) {
    const size_t r = static_cast<size_t>(op.device.value());
    acts[r] += planner::op_output_bytes(planned, op);
    flops[r] += planner::op_flops(op);
    for (const auto& in : op.inputs) {
      const auto& t = planned.tensor(in.tensor);
      if (t.role == graph::TensorRole::kParameter &&
          seen[r].insert(t.name + in.ranges_string()).second)
        f.ranks[r].parameters += static_cast<double>(numel(in.shape()));
    }
  }
  const double m = static_cast<double>(config.micro_batches());
  const double opt_copies = config.optimizer.type == "adamw" ? 2
                            : config.optimizer.momentum > 0  ? 1
                                                             : 0;
  double slowest = 0;
  for (int64_t r = 0; r < world; ++r) {
    RankFigures& rf = f.ranks[static_cast<size_t>(r)];
    for (const auto& a : lowered.adapters) {
      const auto& t = planned.tensor(a.tensor);
      path_share(a.forward, t.shape, size_bytes(t.dtype), r, m, rf);
      path_share(a.backward, t.shape, size_bytes(t.dtype), r, m, rf);
    }
    for (int64_t id : lowered.programs[static_cast<size_t>(r)].grad_syncs) {
      const auto& s = lowered.grad_syncs[static_cast<size_t>(id)];
      const double k = static_cast<double>(s.devices.size());
      const double bytes = 2 * (k - 1) / k * static_cast<double>(numel(s.piece.shape()) * 4);
      rf.sent["grad all_reduce"] += bytes;
      int64_t lo = s.devices.front().value(), hi = lo;
      for (DeviceId d : s.devices) {
        lo = std::min(lo, d.value());
        hi = std::max(hi, d.value());
      }
      const bool one_node = lo / cost.devices_per_node == hi / cost.devices_per_node;
      rf.grad_sync_s +=
          (one_node ? cost.intra_alpha_s : cost.inter_alpha_s) +
          bytes * (one_node ? cost.intra_beta_s_per_byte : cost.inter_beta_s_per_byte);
    }
    rf.compute_s = 3 * flops[static_cast<size_t>(r)] / kDeviceFlops;
    const int64_t pp_index = r / (par.tp * par.dp);
    const double units = pp_index < static_cast<int64_t>(peak_units.size())
                             ? peak_units[static_cast<size_t>(pp_index)]
                             : 1.0;
    rf.param_bytes = rf.parameters * 4;
    rf.optimizer_bytes = rf.param_bytes * opt_copies;
    rf.activation_bytes = acts[static_cast<size_t>(r)] * units;
    rf.peak_bytes = 2 * rf.param_bytes + rf.optimizer_bytes + rf.activation_bytes;
    slowest = std::max(slowest, rf.compute_s + rf.comm_s);
  }
  double sync = 0;
  for (const auto& rf : f.ranks) sync = std::max(sync, rf.grad_sync_s);
  f.step_time_s = m * slowest / std::max(1e-9, 1.0 - bubble_ratio) + sync;
  return f;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", bytes, units[u]);
  return buf;
}

void add_path_bytes(const lower::CommPath& path, const Shape& shape, int64_t elem, int64_t rank,
                    double times, std::map<std::string, double>& out) {
  for (const lower::CommStep& st : path.steps) {
    int64_t pos = -1;
    for (size_t p = 0; p < st.before.devices.size(); ++p)
      if (st.before.devices[p].value() == rank) pos = static_cast<int64_t>(p);
    if (pos < 0) continue;
    const double piece =
        static_cast<double>(numel(st.before.piece(pos, TensorId(0), shape).shape()) * elem);
    const double k = static_cast<double>(st.k);
    double bytes = 0;
    switch (st.primitive) {
      case lower::Primitive::kAllReduce:
        bytes = 2 * (k - 1) / k * piece;
        break;
      case lower::Primitive::kAllGather:
        bytes = (k - 1) * piece;
        break;
      case lower::Primitive::kReduceScatter:
      case lower::Primitive::kAllToAll:
        bytes = (k - 1) / k * piece;
        break;
      case lower::Primitive::kSendRecv:
        for (const auto& pair : st.groups)
          if (pair[0].value() == rank && pair[1].value() != rank) bytes += piece;
        break;
      default:
        break;
    }
    if (bytes > 0) out[lower::to_string(st.primitive)] += bytes * times;
  }
}

}  // namespace loom::cli
