// RVD layouts (nnScaler's term): how a tensor is spread over an ordered group of devices.
// R replicas × V value chunks × D_0..D_{n-1} splits of each dimension. The device at position i
// of `devices` has mixed-radix coordinates (r, v, d_0, ..., d_{n-1}), r outermost and the last
// dimension innermost, and holds value chunk v of V of the d_k-th of D_k equal parts of each
// dimension k.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/ids.h"
#include "core/result.h"
#include "core/shape.h"
#include "graph/tensor.h"

namespace loom::lower {

struct Layout {
  int64_t r = 1;
  int64_t v = 1;
  std::vector<int64_t> d;         // one factor per tensor dimension
  std::vector<DeviceId> devices;  // in mixed-radix order

  // Every device holds the whole tensor.
  static Layout replicated(size_t ndim, std::vector<DeviceId> devices);
  // Dimension `dim` split over all devices.
  static Layout split(size_t ndim, size_t dim, std::vector<DeviceId> devices);
  // Every device holds a partial sum of the whole tensor.
  static Layout partial(size_t ndim, std::vector<DeviceId> devices);

  int64_t size() const { return static_cast<int64_t>(devices.size()); }
  size_t ndim() const { return d.size(); }
  // Factors in coordinate order: r, v, d_0..d_{n-1}.
  std::vector<int64_t> factors() const;
  // Coordinates of the device at `position`, in the order of factors().
  std::vector<int64_t> coords(int64_t position) const;
  int64_t position_of(const std::vector<int64_t>& coords) const;

  // The piece of a tensor of `shape` held by the device at `position`.
  graph::SubTensor piece(int64_t position, TensorId tensor, const Shape& shape) const;
  // Fails when the factors do not multiply to the device count, a device repeats, or a split
  // does not divide its dimension of `shape` (when given).
  Status validate(const Shape* shape = nullptr) const;

  bool same_factors(const Layout& o) const { return r == o.r && v == o.v && d == o.d; }
  bool operator==(const Layout& o) const { return same_factors(o) && devices == o.devices; }
  bool operator!=(const Layout& o) const { return !(*this == o); }
  std::string to_string() const;  // "R2 V1 D[1,2] @ [0,1,2,3]"
};

// The layout formed by pieces of one tensor held by devices (one piece per device), or an error
// naming why they do not form one (unequal parts, mixed value chunk counts, ...).
Result<Layout> layout_of(const std::vector<std::pair<DeviceId, graph::SubTensor>>& pieces,
                         const Shape& shape);

}  // namespace loom::lower
