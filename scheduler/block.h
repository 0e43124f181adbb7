// Blocks: the unit of pipeline scheduling. A block is the work of one stage on one micro-batch
// in one direction (F, B, or the split backward I + W), run by a set of devices together.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/ids.h"
#include "core/result.h"

namespace loom::sched {

// A failure with no config key (the message names the blocks).
inline Error error(std::string message) { return Error{std::move(message), ""}; }

// F forward, B full backward, I input-gradient backward, W weight-gradient backward.
enum class BlockKind : uint8_t { kF, kB, kI, kW };

char to_char(BlockKind kind);                       // 'F', 'B', 'I', 'W'
std::optional<BlockKind> parse_block_kind(char c);  // inverse of to_char
// Forward blocks allocate activations; the others consume them (why list schedulers care).
inline bool is_backward(BlockKind kind) { return kind != BlockKind::kF; }

// The one rule of block costs in loom, in forwards of the same stage and micro-batch: a full
// backward computes the input and the weight gradients, a matrix product each for every one of
// the forward's, so it takes two forwards; split, I and W take one each. `again` is the forward
// a recomputing backward runs first (in B, or in I when split). The scheduler's default units,
// the plan's simulated pipeline, the schedule search's spans and the estimator all use it.
inline constexpr double kBackwardForwards = 2;
constexpr double block_time(BlockKind kind, double forward, double again = 0) {
  switch (kind) {
    case BlockKind::kF:
    case BlockKind::kW:
      return forward;
    case BlockKind::kB:
      return kBackwardForwards * forward + again;
    case BlockKind::kI:
      return forward + again;
  }
  return forward;
}
// A block's activation change in micro-batches of its stage: F allocates one; the end of the
// backward releases it: B, or W when split (I still needs none of it freed).
constexpr double block_memory(BlockKind kind) {
  return kind == BlockKind::kF ? 1.0 : kind == BlockKind::kI ? 0.0 : -1.0;
}

// The identity of a block inside a schedule: written "1B3" (stage 1, B, micro-batch 3), the
// action notation of torch.distributed.pipelining's CSV schedules.
struct BlockId {
  StageId stage;
  MicroBatch mb;
  BlockKind kind = BlockKind::kF;

  static BlockId of(int64_t stage, BlockKind kind, int64_t mb) {
    return BlockId{StageId(stage), MicroBatch(mb), kind};
  }
  // Parses "1B3"; the error names the text.
  static Result<BlockId> parse(std::string_view text);
  std::string to_string() const;  // "1B3"
  // "1B3 (stage 1, micro-batch 3, B)": how errors name a block.
  std::string describe() const;

  friend bool operator==(const BlockId& a, const BlockId& b) {
    return a.stage == b.stage && a.mb == b.mb && a.kind == b.kind;
  }
  friend bool operator!=(const BlockId& a, const BlockId& b) { return !(a == b); }
  friend bool operator<(const BlockId& a, const BlockId& b);
};

struct BlockIdHash {
  size_t operator()(const BlockId& id) const noexcept {
    return std::hash<int64_t>()(id.stage.value() * 1000003 + id.mb.value() * 8 +
                                static_cast<int>(id.kind));
  }
};

// A block with what the simulator needs: the devices that run it together (more than one for
// a tensor-parallel stage), its duration (time units) and its memory change per device (in
// micro-batches of activations: positive is allocated at start, negative released at the end).
struct Block {
  StageId stage;
  MicroBatch mb;
  BlockKind kind = BlockKind::kF;
  std::vector<DeviceId> devices;
  double duration = 0;
  double memory = 0;
  std::string name;  // the placement's name for searched blocks ("f1"); may be empty

  BlockId id() const { return BlockId{stage, mb, kind}; }
  bool runs_on(DeviceId d) const;
  std::string to_string() const;  // "1B3@[1] t=2 mem=-1"

  friend bool operator==(const Block& a, const Block& b) {
    return a.id() == b.id() && a.devices == b.devices && a.duration == b.duration &&
           a.memory == b.memory && a.name == b.name;
  }
  friend bool operator!=(const Block& a, const Block& b) { return !(a == b); }
};

}  // namespace loom::sched
