#include "planner/mesh.h"

namespace loom::planner {

Result<DeviceMesh> DeviceMesh::make(int64_t dp, int64_t pp, int64_t tp, int64_t cp) {
  if (dp < 1 || pp < 1 || tp < 1 || cp < 1)
    return Error::at("parallel", "mesh degrees must be positive, got dp " + std::to_string(dp) +
                                     ", pp " + std::to_string(pp) + ", tp " + std::to_string(tp) +
                                     ", cp " + std::to_string(cp));
  return DeviceMesh(dp, pp, tp, cp);
}

DeviceMesh::Coord DeviceMesh::coord(Rank r) const {
  int64_t v = r.value();
  Coord c;
  c.tp = v % tp_;
  c.cp = (v / tp_) % cp_;
  c.dp = (v / (tp_ * cp_)) % dp_;
  c.pp = v / (tp_ * cp_ * dp_);
  return c;
}

std::vector<Rank> DeviceMesh::tp_group(const Coord& c) const {
  std::vector<Rank> out;
  for (int64_t i = 0; i < tp_; ++i) out.push_back(rank({c.dp, c.pp, i, c.cp}));
  return out;
}

std::vector<Rank> DeviceMesh::dp_group(const Coord& c) const {
  std::vector<Rank> out;
  for (int64_t i = 0; i < dp_; ++i) out.push_back(rank({i, c.pp, c.tp, c.cp}));
  return out;
}

std::vector<Rank> DeviceMesh::pp_group(const Coord& c) const {
  std::vector<Rank> out;
  for (int64_t i = 0; i < pp_; ++i) out.push_back(rank({c.dp, i, c.tp, c.cp}));
  return out;
}

std::string DeviceMesh::to_string() const {
  return "dp" + std::to_string(dp_) + " x pp" + std::to_string(pp_) +
         (cp_ > 1 ? " x cp" + std::to_string(cp_) : std::string()) + " x tp" + std::to_string(tp_) +
         " (" + std::to_string(size()) + " ranks)";
}

}  // namespace loom::planner
