// Communication synthesis: the cheapest sequence of primitives that turns one RVD layout of a
// tensor into another. Each primitive moves a factor k between two of the layout's factors:
//   V→R all-reduce, D→R all-gather, V→D reduce-scatter, D→D all-to-all (intra-group), and the
//   local R→D chunk, R→V value chunk and D→V pad (a slice in zeros: the gradient of a chunk);
//   send/recv moves pieces between disjoint groups (pipeline stages) or reorders devices. Costs are
//   alpha-beta per primitive and link class (cost model), and the path is a shortest path
//   (Dijkstra) over layouts, cached per (shape, layouts).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/cost_model.h"
#include "core/result.h"
#include "lower/layout.h"

namespace loom::lower {

enum class Primitive {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kChunk,
  kValueChunk,
  kPad,
  kSendRecv
};
std::string to_string(Primitive p);

// One step of a path.
struct CommStep {
  Primitive primitive;
  Layout before;
  Layout after;
  int from_factor = 0;  // index into Layout::factors() (0 = R, 1 = V, 2+k = D_k)
  int to_factor = 0;
  int64_t k = 1;  // the part of the factor that moves
  // Collectives: each group's members in collective-rank order. Send/recv: pairs {from, to}.
  std::vector<std::vector<DeviceId>> groups;
  double cost_s = 0;
};

struct CommPath {
  std::vector<CommStep> steps;
  double cost_s = 0;
  bool via_full_replication = false;  // the path passes through a fully replicated layout
  std::string to_string() const;
};

// One registry entry per primitive: when it applies (from factor -> to factor), what it costs.
struct PrimitiveRule {
  Primitive primitive;
  std::function<bool(int from_factor, int to_factor)> applies;
  // Seconds for one group of k members each holding `piece_bytes` before the step.
  std::function<double(int64_t k, double piece_bytes, double alpha, double beta)> cost;
};
const std::vector<PrimitiveRule>& primitive_rules();

// Applies "move k of factor `from` into factor `to`" to a layout: the new factors and device
// order, and the groups of devices that exchange data.
Layout move_factor(const Layout& l, int from, int to, int64_t k,
                   std::vector<std::vector<DeviceId>>* groups = nullptr);

class PathFinder {
 public:
  // Without a model: the built-in default preset's link costs.
  explicit PathFinder(CostModel model = CostModel::builtin()) : model_(std::move(model)) {}

  // The cheapest path from `from` to `to` for a tensor of `shape` with elements of
  // `elem_bytes`. Same device set: collectives and local chunks; disjoint sets: a path within
  // the producers, send/recv, and a path within the consumers.
  // `gradient`: the path carries gradients, where a value chunk may be a slice in zeros (pad).
  Result<CommPath> find(const Shape& shape, int64_t elem_bytes, const Layout& from,
                        const Layout& to, bool gradient = false);
  size_t cache_size() const { return cache_.size(); }
  void clear_cache() { cache_.clear(); }

 private:
  Result<CommPath> intra(const Shape& shape, int64_t elem_bytes, const Layout& from,
                         const Layout& to);
  Result<CommPath> cross(const Shape& shape, int64_t elem_bytes, const Layout& from,
                         const Layout& to);
  bool gradient_ = false;
  double link(const std::vector<DeviceId>& group, double& alpha) const;

  CostModel model_;
  std::map<std::string, CommPath> cache_;
};

}  // namespace loom::lower
