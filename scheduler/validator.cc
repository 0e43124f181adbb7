#include "scheduler/validator.h"

#include "core/strings.h"

namespace loom::sched {

Result<std::vector<std::vector<int>>> resolve_order(
    const Workload& w, const std::vector<std::vector<BlockId>>& order) {
  if (static_cast<int>(order.size()) != w.num_devices())
    return error("the schedule orders " + std::to_string(order.size()) +
                 " devices, the workload has " + std::to_string(w.num_devices()));
  std::vector<std::vector<int>> out(order.size());
  for (size_t d = 0; d < order.size(); ++d) {
    for (const BlockId& id : order[d]) {
      auto i = w.find(id);
      if (!i)
        return error("device " + std::to_string(d) + " runs " + id.describe() +
                     ", which is not a block of this pipeline");
      out[d].push_back(*i);
    }
  }
  LOOM_TRY(validate_order(w, out));
  return out;
}

Status validate_order(const Workload& w, const std::vector<std::vector<int>>& order) {
  if (static_cast<int>(order.size()) != w.num_devices())
    return error("the schedule orders " + std::to_string(order.size()) +
                 " devices, the workload has " + std::to_string(w.num_devices()));
  for (size_t d = 0; d < order.size(); ++d) {
    const DeviceId dev(static_cast<int64_t>(d));
    std::vector<int> pos(w.size(), -1);
    for (size_t k = 0; k < order[d].size(); ++k) {
      int i = order[d][k];
      if (i < 0 || i >= w.size())
        return error("device " + std::to_string(d) + " runs an unknown block");
      const Block& b = w.block(i);
      if (!b.runs_on(dev))
        return error("block " + b.id().describe() + " is ordered on device " + std::to_string(d) +
                     " but runs on other devices");
      if (pos[i] >= 0)
        return error("block " + b.id().describe() + " appears twice on device " +
                     std::to_string(d));
      pos[i] = static_cast<int>(k);
    }
    for (int i : w.blocks_on(dev)) {
      if (pos[i] < 0)
        return error("block " + w.block(i).id().describe() + " is missing from device " +
                     std::to_string(d) + "'s order");
      for (int dep : w.deps(i)) {
        if (w.block(dep).runs_on(dev) && pos[dep] > pos[i])
          return error("block " + w.block(i).id().describe() + " runs before its dependency " +
                       w.block(dep).id().to_string() + " on device " + std::to_string(d));
      }
    }
  }
  LOOM_TRY(execution_order(w, order));
  return Status::success();
}

Result<std::vector<int>> execution_order(const Workload& w,
                                         const std::vector<std::vector<int>>& order) {
  const int n = w.size();
  // Each block's successors (its dependants, then the next block on each device), in one array:
  // out_of(u) = out[first[u], first[u + 1]), in the order the edges are listed.
  std::vector<int> indeg(n, 0), first(n + 1, 0);
  auto each_edge = [&](const auto& edge) {
    for (int i = 0; i < n; ++i)
      for (int d : w.deps(i)) edge(d, i);
    for (const auto& dev : order)
      for (size_t k = 1; k < dev.size(); ++k) edge(dev[k - 1], dev[k]);
  };
  each_edge([&](int a, int b) { ++first[a + 1], ++indeg[b]; });
  for (int i = 0; i < n; ++i) first[i + 1] += first[i];
  std::vector<int> out(static_cast<size_t>(first[n])), filled(first.begin(), first.end() - 1);
  each_edge([&](int a, int b) { out[static_cast<size_t>(filled[a]++)] = b; });
  std::vector<int> ready, topo;
  topo.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    if (!indeg[i]) ready.push_back(i);
  while (!ready.empty()) {
    int u = ready.back();
    ready.pop_back();
    topo.push_back(u);
    for (int e = first[u]; e < first[u + 1]; ++e)
      if (--indeg[out[e]] == 0) ready.push_back(out[e]);
  }
  if (static_cast<int>(topo.size()) == n) return topo;
  // Walk back along unfinished predecessors from a stuck block until a block repeats: a cycle.
  std::vector<std::vector<int>> in(n);
  for (int u = 0; u < n; ++u)
    for (int e = first[u]; e < first[u + 1]; ++e) in[out[e]].push_back(u);
  int cur = 0;
  while (!indeg[cur]) ++cur;
  std::vector<int> seen_at(n, -1), path;
  while (seen_at[cur] < 0) {
    seen_at[cur] = static_cast<int>(path.size());
    path.push_back(cur);
    for (int p : in[cur])
      if (indeg[p]) {
        cur = p;
        break;
      }
  }
  std::vector<std::string> cycle;
  for (size_t k = seen_at[cur]; k < path.size(); ++k) {
    const Block& b = w.block(path[k]);
    std::string devs;
    for (size_t j = 0; j < b.devices.size(); ++j) devs += (j ? "," : "") + b.devices[j].to_string();
    cycle.push_back(b.id().to_string() + " (device " + devs + ")");
  }
  return error(
      "the schedule deadlocks: each block waits for the next one, on a dependency or on "
      "its device's order: " +
      join(cycle, " -> ") + " -> " + cycle.front());
}

}  // namespace loom::sched
