// Placement: one micro-batch's blocks for the repetend search (any operator placement, not only
// a chain): device sets, spans, memory deltas and dependencies by name. Loaded from the YAML of
// configs/placements/ or generated for the V, X, M and K shapes at any device count.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "core/result.h"
#include "scheduler/workload.h"

namespace loom::sched {

struct PlacedBlock {
  std::string name;  // unique within the placement ("f1")
  BlockKind kind = BlockKind::kF;
  // The stage it runs in the CSV/trace notation; from `stage:` or the name's trailing number.
  StageId stage;
  // Which micro-batch of one placement instance (X-shape: 0 goes down, 1 up). Instance k of
  // the placement runs micro-batch k * micro_batches_per_instance() + micro_batch.
  int micro_batch = 0;
  std::vector<DeviceId> devices;
  double span = 1;         // time units
  double memory = 0;       // per device, micro-batches of activations
  std::vector<int> after;  // indices of the blocks it waits for

  friend bool operator==(const PlacedBlock& a, const PlacedBlock& b) {
    return a.name == b.name && a.kind == b.kind && a.stage == b.stage &&
           a.micro_batch == b.micro_batch && a.devices == b.devices && a.span == b.span &&
           a.memory == b.memory && a.after == b.after;
  }
};

class Placement {
 public:
  static constexpr double kNoLimit = std::numeric_limits<double>::infinity();

  Placement() = default;
  // Validates: unique names, devices in range, acyclic dependencies, positive spans, and the
  // memory of every device returning to zero after one instance.
  static Result<Placement> create(int devices, double memory_limit,
                                  std::vector<PlacedBlock> blocks);
  // YAML (format in README.md); errors name the file, the line and the block or key.
  static Result<Placement> parse(const std::string& yaml, const std::string& source);
  static Result<Placement> load(const std::string& path);

  // 1F1B's placement: stage s on device s, F down the chain, B back up.
  static Placement v_shape(int p, double fwd = 1, double bwd = kBackwardForwards);
  // ZB-H1's placement: the V-shape with each backward split into I (input gradients, back up
  // the chain, releasing nothing) and W (weight gradients, after the stage's own I on the same
  // device, releasing the activations).
  static Placement v_shape_split(int p, double fwd = 1, double input = 1, double weight = 1);
  // Chimera's pair: micro-batch 0 down (stage s on device s), micro-batch 1 up (on p-1-s).
  static Placement x_shape(int p, double fwd = 1, double bwd = kBackwardForwards);
  // A GPT: embedding and LM head on all devices around a V chain (LM head logits: 1 unit).
  static Placement m_shape(int p, double fwd = 1, double bwd = kBackwardForwards);
  // A chain with a tensor-parallel stage on devices h and h+1 (h = p/2 - 1): p-1 stages.
  static Placement k_shape(int p, double fwd = 1, double bwd = kBackwardForwards);

  int num_devices() const { return devices_; }
  double memory_limit() const { return memory_limit_; }
  void set_memory_limit(double limit) { memory_limit_ = limit; }
  const std::vector<PlacedBlock>& blocks() const { return blocks_; }
  int micro_batches_per_instance() const;
  // Work of one instance on device d (time units): a lower bound on the repetend's period.
  double load(DeviceId d) const;

  // The blocks of `instances` consecutive instances (dependencies stay within an instance).
  Result<Workload> unroll(int instances) const;
  // Index in unroll(): instance k of block j.
  int unrolled_index(int instance, int block) const {
    return instance * static_cast<int>(blocks_.size()) + block;
  }

  Status validate() const;
  std::string to_yaml() const;

  friend bool operator==(const Placement& a, const Placement& b) {
    return a.devices_ == b.devices_ && a.memory_limit_ == b.memory_limit_ && a.blocks_ == b.blocks_;
  }

 private:
  int devices_ = 0;
  double memory_limit_ = kNoLimit;
  std::vector<PlacedBlock> blocks_;
};

}  // namespace loom::sched
