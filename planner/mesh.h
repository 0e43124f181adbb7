// The device mesh: ranks laid out over named axes dp × pp × cp × tp, tensor-parallel ranks
// neighbours, then context-parallel ones (rank = tp + tp_size * (cp + cp_size * (dp + dp_size *
// pp))), as Megatron orders them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/ids.h"
#include "core/result.h"

namespace loom::planner {

class DeviceMesh {
 public:
  struct Coord {
    int64_t dp = 0, pp = 0, tp = 0, cp = 0;
    bool operator==(const Coord& o) const {
      return dp == o.dp && pp == o.pp && tp == o.tp && cp == o.cp;
    }
  };

  // Fails unless every degree is positive.
  static Result<DeviceMesh> make(int64_t dp, int64_t pp, int64_t tp, int64_t cp = 1);
  DeviceMesh() = default;  // one device

  int64_t dp() const { return dp_; }
  int64_t pp() const { return pp_; }
  int64_t tp() const { return tp_; }
  int64_t cp() const { return cp_; }
  int64_t size() const { return dp_ * pp_ * tp_ * cp_; }

  Rank rank(const Coord& c) const { return Rank(c.tp + tp_ * (c.cp + cp_ * (c.dp + dp_ * c.pp))); }
  Coord coord(Rank r) const;
  // The ranks that share every coordinate of `c` but the named axis, in axis order.
  std::vector<Rank> tp_group(const Coord& c) const;
  std::vector<Rank> dp_group(const Coord& c) const;
  std::vector<Rank> pp_group(const Coord& c) const;

  std::string to_string() const;  // "dp2 x pp2 x tp2 (8 ranks)", "x cpN" where N > 1
  bool operator==(const DeviceMesh& o) const {
    return dp_ == o.dp_ && pp_ == o.pp_ && tp_ == o.tp_ && cp_ == o.cp_;
  }

 private:
  DeviceMesh(int64_t dp, int64_t pp, int64_t tp, int64_t cp) : dp_(dp), pp_(pp), tp_(tp), cp_(cp) {}
  int64_t dp_ = 1, pp_ = 1, tp_ = 1, cp_ = 1;
};

}  // namespace loom::planner
