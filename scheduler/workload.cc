#include "scheduler/workload.h"

#include <sstream>

namespace loom::sched {

Result<Workload> Workload::create(int num_devices, std::vector<Block> blocks,
                                  std::vector<std::vector<int>> deps) {
  Workload w;
  w.num_devices_ = num_devices;
  w.blocks_ = std::move(blocks);
  w.deps_ = std::move(deps);
  if (w.deps_.size() != w.blocks_.size()) w.deps_.resize(w.blocks_.size());
  for (int i = 0; i < w.size(); ++i) {
    if (!w.index_.emplace(w.blocks_[i].id(), i).second)
      return error("block " + w.blocks_[i].id().describe() + " is defined twice");
  }
  LOOM_TRY(w.validate());
  return w;
}

Result<Workload> Workload::chain(const ChainLayout& l) {
  if (l.num_devices < 1) return error("a pipeline needs at least one device");
  if (l.num_stages < 1) return error("a pipeline needs at least one stage");
  if (l.micro_batches < 1)
    return error("a pipeline needs at least one micro-batch, got " +
                 std::to_string(l.micro_batches));
  std::vector<Block> blocks;
  std::vector<std::vector<int>> deps;
  const int S = l.num_stages;
  auto split = [&](int s, int k) {
    return l.split_at ? l.split_at(StageId(s), MicroBatch(k)) : l.split_backward;
  };
  // First block index of (stage, mb); its slots are 0 = F, 1 = B or I, 2 = W.
  std::vector<int> first(static_cast<size_t>(l.micro_batches) * S + 1, 0);
  for (int k = 0; k < l.micro_batches; ++k)
    for (int s = 0; s < S; ++s) first[k * S + s + 1] = first[k * S + s] + (split(s, k) ? 3 : 2);
  auto idx = [&](int s, int k, int slot) { return first[k * S + s] + slot; };
  for (int k = 0; k < l.micro_batches; ++k) {
    for (int s = 0; s < S; ++s) {
      const bool split_here = split(s, k);
      for (int slot = 0; slot < (split_here ? 3 : 2); ++slot) {
        BlockKind kind = slot == 0   ? BlockKind::kF
                         : slot == 1 ? (split_here ? BlockKind::kI : BlockKind::kB)
                                     : BlockKind::kW;
        Block b;
        b.stage = StageId(s);
        b.mb = MicroBatch(k);
        b.kind = kind;
        b.devices = l.devices(b.stage, b.mb);
        b.duration = l.duration(kind, b.stage);
        b.memory = l.memory(kind, b.stage);
        std::vector<int> d;
        if (slot == 0 && s > 0) d.push_back(idx(s - 1, k, 0));
        if (slot == 1) {
          if (s + 1 < S) d.push_back(idx(s + 1, k, 1));
          d.push_back(idx(s, k, 0));
        }
        if (slot == 2) d.push_back(idx(s, k, 1));
        blocks.push_back(std::move(b));
        deps.push_back(std::move(d));
      }
    }
  }
  return create(l.num_devices, std::move(blocks), std::move(deps));
}

std::optional<int> Workload::find(const BlockId& id) const {
  auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

std::vector<int> Workload::blocks_on(DeviceId d) const {
  std::vector<int> out;
  for (int i = 0; i < size(); ++i)
    if (blocks_[i].runs_on(d)) out.push_back(i);
  return out;
}

Result<Workload> Workload::with_durations(
    const std::function<double(const Block&)>& duration) const {
  Workload w = *this;
  for (Block& b : w.blocks_) {
    b.duration = duration(b);
    if (!(b.duration >= 0)) return error("block " + b.id().describe() + " has a negative duration");
  }
  return w;
}

Status Workload::validate() const {
  if (num_devices_ < 1) return error("a workload needs at least one device");
  for (int i = 0; i < size(); ++i) {
    const Block& b = blocks_[i];
    if (b.devices.empty()) return error("block " + b.id().describe() + " runs on no device");
    for (size_t a = 0; a < b.devices.size(); ++a) {
      if (b.devices[a].value() < 0 || b.devices[a].value() >= num_devices_)
        return error("block " + b.id().describe() + " runs on device " + b.devices[a].to_string() +
                     ", outside 0.." + std::to_string(num_devices_ - 1));
      for (size_t c = 0; c < a; ++c)
        if (b.devices[a] == b.devices[c])
          return error("block " + b.id().describe() + " lists device " + b.devices[a].to_string() +
                       " twice");
    }
    if (!(b.duration >= 0)) return error("block " + b.id().describe() + " has a negative duration");
    for (int d : deps_[i])
      if (d < 0 || d >= size() || d == i)
        return error("block " + b.id().describe() + " has an invalid dependency");
  }
  // Acyclic (Kahn).
  std::vector<int> indeg(size(), 0);
  std::vector<std::vector<int>> out(size());
  for (int i = 0; i < size(); ++i)
    for (int d : deps_[i]) out[d].push_back(i), ++indeg[i];
  std::vector<int> stack;
  for (int i = 0; i < size(); ++i)
    if (!indeg[i]) stack.push_back(i);
  int seen = 0;
  while (!stack.empty()) {
    int u = stack.back();
    stack.pop_back();
    ++seen;
    for (int v : out[u])
      if (--indeg[v] == 0) stack.push_back(v);
  }
  if (seen != size()) {
    for (int i = 0; i < size(); ++i)
      if (indeg[i])
        return error("the dependencies of block " + blocks_[i].id().describe() + " form a cycle");
  }
  return Status::success();
}

std::string Workload::to_string() const {
  std::ostringstream os;
  os << "workload: " << num_devices_ << " devices, " << size() << " blocks\n";
  for (int i = 0; i < size(); ++i) {
    os << "  " << blocks_[i].to_string();
    if (!deps_[i].empty()) {
      os << " after";
      for (int d : deps_[i]) os << " " << blocks_[d].id().to_string();
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace loom::sched
