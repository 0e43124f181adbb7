// Strong id types: a Rank is not a StageId is not a MicroBatch, even though each is an integer.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

namespace loom {

template <class Tag>
class StrongId {
 public:
  constexpr StrongId() = default;
  constexpr explicit StrongId(int64_t value) : value_(value) {}

  constexpr int64_t value() const { return value_; }
  constexpr bool valid() const { return value_ >= 0; }

  friend constexpr bool operator==(StrongId a, StrongId b) { return a.value_ == b.value_; }
  friend constexpr bool operator!=(StrongId a, StrongId b) { return a.value_ != b.value_; }
  friend constexpr bool operator<(StrongId a, StrongId b) { return a.value_ < b.value_; }
  friend constexpr bool operator<=(StrongId a, StrongId b) { return a.value_ <= b.value_; }
  friend constexpr bool operator>(StrongId a, StrongId b) { return a.value_ > b.value_; }
  friend constexpr bool operator>=(StrongId a, StrongId b) { return a.value_ >= b.value_; }
  friend std::ostream& operator<<(std::ostream& os, StrongId id) { return os << id.value_; }
  std::string to_string() const { return std::to_string(value_); }

 private:
  int64_t value_ = -1;
};

using Rank = StrongId<struct RankTag>;
using DeviceId = StrongId<struct DeviceIdTag>;
using StageId = StrongId<struct StageIdTag>;
using MicroBatch = StrongId<struct MicroBatchTag>;
using TensorId = StrongId<struct TensorIdTag>;
using OpId = StrongId<struct OpIdTag>;

}  // namespace loom

template <class Tag>
struct std::hash<loom::StrongId<Tag>> {
  size_t operator()(loom::StrongId<Tag> id) const noexcept {
    return std::hash<int64_t>()(id.value());
  }
};
