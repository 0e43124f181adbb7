// Regions of the single-device tensors, the algebra the static equivalence proof
// (lower/equivalence.h) walks a lowered plan with. A region is a box of index ranges of one
// FullTensor and the part of its value it holds: which share of which partial sums. Values are
// kept exactly (rational coefficients), so "each partial counted exactly once" is an equality,
// not a tolerance. LibTorch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"
#include "graph/tensor.h"
#include "lower/path.h"

namespace loom::lower {

// An exact fraction p/q (q > 0, reduced).
struct Frac {
  int64_t p = 0;
  int64_t q = 1;
  static Frac of(int64_t p, int64_t q);
  Frac operator+(const Frac& o) const;
  Frac operator*(const Frac& o) const;
  bool operator==(const Frac& o) const { return p == o.p && q == o.q; }
  bool operator!=(const Frac& o) const { return !(*this == o); }
  bool operator<(const Frac& o) const;
  std::string to_string() const;
};

// What part of a tensor's value a piece holds. The FullTensor's value is seen as the sum of a
// continuum of chunks x in [0, 1) (chunk c of m is [c/m, (c+1)/m)); a piece holds
// sum coef(x) * chunk(x), coef piecewise constant. The whole value is coef 1 everywhere; a
// partial sum chunk c of m is 1 on its interval and 0 elsewhere; a value_chunk step's 1/k of
// a replica is 1/k everywhere. A sum of pieces is the whole value exactly when the coefficients
// add up to 1 everywhere: a missing partial leaves a 0, a doubled one a 2.
class ValueMix {
 public:
  static ValueMix whole();
  static ValueMix chunk(int64_t c, int64_t m);
  static ValueMix zero();

  ValueMix scaled(Frac f) const;
  // The value squeezed into chunk `sub` of `k` (the pad step: a slice among zeros).
  ValueMix squeezed(int64_t sub, int64_t k) const;
  ValueMix operator+(const ValueMix& o) const;
  bool is_whole() const;
  bool operator==(const ValueMix& o) const;
  bool operator!=(const ValueMix& o) const { return !(*this == o); }
  std::string to_string() const;  // "whole", "partial 1/2 of 2", "1/2 x whole", ...

 private:
  struct Seg {
    Frac lo, hi, coef;
  };
  std::vector<Seg> segs_;  // sorted, tiling [0, 1), adjacent equal coefficients merged
  void normalise();
};

// A box of a FullTensor and the value it holds.
struct Region {
  TensorId tensor;
  std::vector<graph::Range> ranges;
  ValueMix value = ValueMix::whole();

  static Region of(const graph::SubTensor& s);
  bool same_box(const Region& o) const { return tensor == o.tensor && ranges == o.ranges; }
  bool operator==(const Region& o) const { return same_box(o) && value == o.value; }
  std::string to_string() const;  // "[0:4, 0:32] whole"
};

// Per device (indexed by rank), the region it holds of one tensor; `held` false: nothing.
struct DeviceRegions {
  std::vector<Region> region;
  std::vector<char> held;
  explicit DeviceRegions(size_t world = 0) : region(world), held(world, 0) {}
  void set(int64_t d, Region r) {
    region[static_cast<size_t>(d)] = std::move(r);
    held[static_cast<size_t>(d)] = 1;
  }
  bool has(int64_t d) const {
    return d >= 0 && d < static_cast<int64_t>(held.size()) && held[static_cast<size_t>(d)];
  }
};

// Runs one step of a communication path on the regions each device holds, as the runtime does
// (runtime/path_runner.cc): collectives combine their group's pieces in member order, local
// steps cut or scale, send/recv moves pieces. Fails, naming the devices, the group and the
// pieces, when the pieces cannot combine (a gap or an overlap in a gather, unlike boxes in a
// sum, a member holding nothing).
Status run_step(const CommStep& step, DeviceRegions& state);

// Whether the boxes tile the box `whole` exactly once (no gap, no overlap); when not, `why`
// says where and `culprit` is the index of the box that overlaps another or lies outside
// (boxes.size() for a gap).
bool tiles_exactly(const std::vector<std::vector<graph::Range>>& boxes,
                   const std::vector<graph::Range>& whole, std::string* why,
                   size_t* culprit = nullptr);

std::string ranges_string(const std::vector<graph::Range>& ranges);

}  // namespace loom::lower
