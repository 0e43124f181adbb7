#include "scheduler/csv.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "core/strings.h"
#include "scheduler/simulator.h"

namespace loom::sched {

Result<std::string> to_csv(const Schedule& s) {
  std::vector<Block> blocks = s.workload().blocks();
  std::vector<std::vector<int>> deps;
  for (int i = 0; i < s.workload().size(); ++i) deps.push_back(s.workload().deps(i));
  for (auto& b : blocks) b.duration = 1;
  LOOM_ASSIGN_OR_RETURN(Workload unit,
                        Workload::create(s.num_devices(), std::move(blocks), std::move(deps)));
  LOOM_ASSIGN_OR_RETURN(Schedule steps, Schedule::from_indices(std::move(unit), s.order()));
  LOOM_ASSIGN_OR_RETURN(Timeline t, simulate(steps));
  const int columns = static_cast<int>(std::lround(t.makespan));
  std::ostringstream os;
  for (int d = 0; d < s.num_devices(); ++d) {
    std::vector<std::string> cells(columns);
    for (int i : s.order()[d])
      cells[static_cast<int>(std::lround(t.start[i]))] = s.workload().block(i).id().to_string();
    os << join(cells, ",") << "\n";
  }
  return os.str();
}

Result<Schedule> from_csv(const std::string& text, const CsvImportOptions& opt) {
  std::vector<std::vector<BlockId>> order;
  std::map<BlockId, std::vector<DeviceId>> devices;
  int64_t stages = 0, mbs = 0;
  bool has_b = false, has_split = false;
  std::istringstream in(text);
  std::string line;
  int row = 0;
  while (std::getline(in, line)) {
    ++row;
    if (trim(line).empty()) continue;  // a trailing newline, not a rank
    const DeviceId dev(static_cast<int64_t>(order.size()));
    order.emplace_back();
    auto cells = split(line, ',');
    for (size_t c = 0; c < cells.size(); ++c) {
      std::string cell(trim(cells[c]));
      if (cell.empty()) continue;
      auto id = BlockId::parse(cell);
      if (!id.ok())
        return Error::at("csv", "row " + std::to_string(row) + ", column " + std::to_string(c + 1) +
                                    ": " + id.error().message);
      order.back().push_back(*id);
      auto& devs = devices[*id];
      if (std::find(devs.begin(), devs.end(), dev) == devs.end()) devs.push_back(dev);
      stages = std::max(stages, id->stage.value() + 1);
      mbs = std::max(mbs, id->mb.value() + 1);
      has_b |= id->kind == BlockKind::kB;
      has_split |= id->kind == BlockKind::kI || id->kind == BlockKind::kW;
    }
  }
  if (order.empty()) return Error::at("csv", "the schedule has no rows");
  if (has_b && has_split)
    return Error::at("csv",
                     "the schedule mixes full backward (B) with split backward (I, W) blocks");
  const int p = static_cast<int>(order.size());
  const double v = stages % p == 0 ? static_cast<double>(stages / p) : 1.0;
  // Every block of the chain must be run somewhere.
  for (int64_t k = 0; k < mbs; ++k)
    for (int64_t st = 0; st < stages; ++st)
      for (BlockKind kind :
           has_split ? std::vector<BlockKind>{BlockKind::kF, BlockKind::kI, BlockKind::kW}
                     : std::vector<BlockKind>{BlockKind::kF, BlockKind::kB}) {
        BlockId id = BlockId::of(st, kind, k);
        if (!devices.count(id))
          return Error::at("csv", "block " + id.describe() + " is missing: no rank runs it");
      }
  ChainLayout l;
  l.num_devices = p;
  l.num_stages = static_cast<int>(stages);
  l.micro_batches = static_cast<int>(mbs);
  l.split_backward = has_split;
  l.devices = [&devices](StageId s, MicroBatch k) {
    std::vector<DeviceId> out;
    for (auto kind : {BlockKind::kF, BlockKind::kB, BlockKind::kI, BlockKind::kW}) {
      auto it = devices.find(BlockId{s, k, kind});
      if (it != devices.end()) {
        for (DeviceId d : it->second)
          if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
        break;  // the forward's devices; the others are checked by the validator
      }
    }
    return out;
  };
  l.duration = [&opt, v](BlockKind k, StageId) {
    switch (k) {
      case BlockKind::kF:
        return opt.fwd / v;
      case BlockKind::kB:
      case BlockKind::kI:
        return opt.bwd / v;
      case BlockKind::kW:
        return opt.wgrad / v;
    }
    return 0.0;
  };
  l.memory = [v, has_split](BlockKind k, StageId) {
    if (k == BlockKind::kF) return 1.0 / v;
    if (k == BlockKind::kW || (k == BlockKind::kB && !has_split)) return -1.0 / v;
    return 0.0;
  };
  auto w = Workload::chain(l);
  if (!w.ok()) return Error::at("csv", w.error().message);
  auto s = Schedule::create(std::move(w).value(), std::move(order), "csv");
  if (!s.ok()) return Error::at("csv", s.error().message);
  return s;
}

}  // namespace loom::sched
