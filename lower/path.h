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
// The primitive's registry name ("all_reduce", ...).
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

// How a primitive runs: a collective over each group of its step, a computation on each device
// alone, or messages between pairs of devices (send/recv: the only step that joins two device
// groups, so a path's producers and consumers meet at it).
enum class PrimitiveKind { kCollective, kLocal, kTransfer };

// One registry entry per primitive, its one home: name, when it applies, what it costs and what
// it sends. Running it is the runtime's (runtime/path_runner.cc keeps one function per entry,
// keyed by `primitive`, checked complete when a PathRunner is made), as lower/ is LibTorch-free.
struct PrimitiveRule {
  Primitive primitive;
  std::string name;  // the cost model's key (cost.intra_<name>_alpha_s) and the plan dump's
  PrimitiveKind kind;
  // Moves a factor only on gradient paths (pad: the gradient of a chunk is its slice in zeros);
  // forward values stay uniform chunks.
  bool gradient_only = false;
  // Its bytes scale with the filled part of a mixture of experts' slots (the runtime's ragged
  // all-to-all sends only the rows tokens fill).
  bool ragged = false;
  // Whether it moves factor `from_factor` into `to_factor` (0 = R, 1 = V, 2+k = D_k); never
  // for send/recv, which reorders devices or crosses groups instead.
  std::function<bool(int from_factor, int to_factor)> applies;
  // Seconds for one group of k members (send/recv: one message) each holding `piece_bytes`
  // before the step, on a link of `alpha` seconds and `beta` seconds per byte.
  std::function<double(int64_t k, double piece_bytes, double alpha, double beta)> cost;
  // Bytes one member of a group of k puts on the wire (send/recv: one message's sender).
  std::function<double(int64_t k, double piece_bytes)> bytes;
};
// Every primitive, in the order of the Primitive enumeration.
const std::vector<PrimitiveRule>& primitive_rules();
const PrimitiveRule& rule_of(Primitive p);
// The entry named `name`; null when none is.
const PrimitiveRule* find_primitive(const std::string& name);

// Bytes `rank` sends in `step`, holding `piece_bytes` before it: its group's share of a
// collective, each of its messages to another device for send/recv, nothing for a local step.
double bytes_sent(const CommStep& step, int64_t rank, double piece_bytes);

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
  // One send/recv message of `bytes` from `src` to `dst`, on the link class between them.
  double message_seconds(DeviceId src, DeviceId dst, double bytes) const;

  CostModel model_;
  std::map<std::string, CommPath> cache_;
};

}  // namespace loom::lower
