// Workload: every block a schedule must run, with the dependencies between blocks. A schedule
// (schedule.h) is a workload plus an order per device.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "scheduler/block.h"

namespace loom::sched {

// A chain pipeline (the shape of every predefined schedule): stages 0..S-1, F of stage s+1
// after F of s, B of s after B of s+1 and after F of s, and when the backward is split, I in
// place of B and W of s after I of s.
struct ChainLayout {
  int num_devices = 0;
  int num_stages = 0;
  int micro_batches = 0;
  bool split_backward = false;
  // When set, says per stage and micro-batch whether its backward is split (I + W) or a full B,
  // in place of split_backward: an imported schedule may split some backwards and not others.
  std::function<bool(StageId, MicroBatch)> split_at;
  // Devices running stage s for micro-batch k (Chimera places a stage per micro-batch).
  std::function<std::vector<DeviceId>(StageId, MicroBatch)> devices;
  // Duration of a block of this kind at this stage (time units).
  std::function<double(BlockKind, StageId)> duration;
  // Memory change of a block of this kind at this stage (micro-batches of activations).
  std::function<double(BlockKind, StageId)> memory;
};

class Workload {
 public:
  Workload() = default;
  // Checks ids are unique, devices in range, dependencies in range and acyclic.
  static Result<Workload> create(int num_devices, std::vector<Block> blocks,
                                 std::vector<std::vector<int>> deps);
  // The blocks and dependencies of a chain pipeline.
  static Result<Workload> chain(const ChainLayout& layout);

  int num_devices() const { return num_devices_; }
  int size() const { return static_cast<int>(blocks_.size()); }
  const Block& block(int i) const { return blocks_[i]; }
  const std::vector<Block>& blocks() const { return blocks_; }
  // Indices of the blocks that block i waits for.
  const std::vector<int>& deps(int i) const { return deps_[i]; }
  std::optional<int> find(const BlockId& id) const;
  // The blocks device d must run (indices), in workload order.
  std::vector<int> blocks_on(DeviceId d) const;

  Status validate() const;
  std::string to_string() const;

  // The same blocks and dependencies, each block taking `duration(block)`: only the durations
  // are checked (create's check), the rest holds already.
  Result<Workload> with_durations(const std::function<double(const Block&)>& duration) const;

  friend bool operator==(const Workload& a, const Workload& b) {
    return a.num_devices_ == b.num_devices_ && a.blocks_ == b.blocks_ && a.deps_ == b.deps_;
  }

 private:
  int num_devices_ = 0;
  std::vector<Block> blocks_;
  std::vector<std::vector<int>> deps_;
  std::unordered_map<BlockId, int, BlockIdHash> index_;
};

}  // namespace loom::sched
