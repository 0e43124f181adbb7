#include "exec/lower/recompute.h"

#include <set>

#include "exec/lower/fusion.h"

namespace loom::lower {

Result<Recompute> parse_recompute(const std::string& text) {
  if (text == "none") return Recompute::kNone;
  if (text == "selective") return Recompute::kSelective;
  if (text == "full") return Recompute::kFull;
  return Error::at("parallel.recompute", "must be none, selective or full, got '" + text + "'");
}

namespace {

constexpr int64_t kNoLayer = graph::kPreLayers;

// The model layer an item would be recomputed with, or kNoLayer: an op's own layer (when it is
// a model layer and makes no loss); an adapter running inside its stage's ranks, the layer of
// the op after it.
std::vector<int64_t> item_layers(const graph::Graph& g, const Lowered& lowered,
                                 const Segment& seg) {
  std::vector<int64_t> layer(seg.items.size(), kNoLayer);
  int64_t next = kNoLayer;
  for (size_t i = seg.items.size(); i-- > 0;) {
    const SegmentItem& it = seg.items[i];
    if (it.kind == SegmentItem::Kind::kOp) {
      const graph::Op& op = g.ops()[static_cast<size_t>(it.index)];
      bool loss = false;
      for (const auto& out : op.outputs)
        loss = loss || g.tensor(out.tensor).role == graph::TensorRole::kLoss;
      const bool model_layer = op.layer() != graph::kPreLayers && op.layer() != graph::kPostLayers;
      next = model_layer && !loss ? op.layer() : kNoLayer;
      layer[i] = next;
    } else {
      const Adapter& a = lowered.adapters[static_cast<size_t>(it.index)];
      const bool inside = !it.producer_side && !a.disjoint && !a.cross_stage();
      layer[i] = inside ? next : kNoLayer;
      if (!inside) next = kNoLayer;
    }
  }
  return layer;
}

std::vector<RecomputeRegion> full_regions(const graph::Graph& g, const Lowered& lowered,
                                          const Segment& seg) {
  const std::vector<int64_t> layer = item_layers(g, lowered, seg);
  std::vector<RecomputeRegion> out;
  const int64_t n = static_cast<int64_t>(seg.items.size());
  for (int64_t i = 0; i < n;) {
    if (layer[static_cast<size_t>(i)] == kNoLayer) {
      ++i;
      continue;
    }
    int64_t j = i;
    while (j < n && layer[static_cast<size_t>(j)] == layer[static_cast<size_t>(i)]) ++j;
    out.push_back({i, j});
    i = j;
  }
  return out;
}

std::vector<RecomputeRegion> selective_regions(const graph::Graph& g, const Segment& seg,
                                               const std::vector<bool>& fused) {
  std::vector<RecomputeRegion> out;
  for (size_t i = 0; i < seg.items.size(); ++i) {
    const SegmentItem& it = seg.items[i];
    if (it.kind != SegmentItem::Kind::kOp) continue;
    const auto op = static_cast<size_t>(it.index);
    if (g.ops()[op].def->attention_core && !fused[op])
      out.push_back({static_cast<int64_t>(i), static_cast<int64_t>(i) + 1});
  }
  return out;
}

}  // namespace

void mark_recompute(const graph::Graph& planned, Lowered& lowered, Recompute mode) {
  const std::vector<bool> fused =
      mode == Recompute::kSelective ? fused_into_next(planned, lowered) : std::vector<bool>();
  for (Program& prog : lowered.programs)
    for (Segment& seg : prog.segments) {
      switch (mode) {
        case Recompute::kNone:
          seg.recompute.clear();
          break;
        case Recompute::kSelective:
          seg.recompute = selective_regions(planned, seg, fused);
          break;
        case Recompute::kFull:
          seg.recompute = full_regions(planned, lowered, seg);
          break;
      }
    }
}

RegionBorder region_border(const graph::Graph& g, const Lowered& lowered, const Program& prog,
                           size_t segment, const RecomputeRegion& region) {
  auto inside = [&](size_t s, size_t i) {
    return s == segment && static_cast<int64_t>(i) >= region.begin &&
           static_cast<int64_t>(i) < region.end;
  };
  // Which op reads which tensor through an adapter, by (tensor, consumer op name).
  std::set<std::pair<int64_t, std::string>> through_adapter;
  for (const Adapter& a : lowered.adapters)
    for (const std::string& c : a.consumers) through_adapter.insert({a.tensor.value(), c});
  std::set<int64_t> read_outside;                       // tensors read directly outside
  std::set<std::pair<int64_t, std::string>> consumers;  // (tensor, op) reading through adapters
  for (size_t s = 0; s < prog.segments.size(); ++s)
    for (size_t i = 0; i < prog.segments[s].items.size(); ++i) {
      if (inside(s, i)) continue;
      const SegmentItem& it = prog.segments[s].items[i];
      if (it.kind == SegmentItem::Kind::kAdapter) {
        read_outside.insert(lowered.adapters[static_cast<size_t>(it.index)].tensor.value());
        continue;
      }
      const graph::Op& op = g.ops()[static_cast<size_t>(it.index)];
      for (const auto& in : op.inputs) {
        const std::pair<int64_t, std::string> key{in.tensor.value(), op.def->name};
        if (through_adapter.count(key))
          consumers.insert(key);
        else
          read_outside.insert(in.tensor.value());
      }
    }
  RegionBorder border;
  const Segment& seg = prog.segments[segment];
  for (int64_t i = region.begin; i < region.end; ++i) {
    const SegmentItem& it = seg.items[static_cast<size_t>(i)];
    if (it.kind == SegmentItem::Kind::kAdapter) {
      const Adapter& a = lowered.adapters[static_cast<size_t>(it.index)];
      for (const std::string& c : a.consumers)
        if (consumers.count({a.tensor.value(), c})) {
          border.adapters.push_back(a.id);
          break;
        }
      continue;
    }
    for (const auto& out : g.ops()[static_cast<size_t>(it.index)].outputs) {
      const int64_t t = out.tensor.value();
      if (read_outside.count(t) || g.tensor(out.tensor).role == graph::TensorRole::kLoss)
        border.tensors.push_back(t);
    }
  }
  return border;
}

bool recomputed(const Segment& segment, int64_t item) {
  for (const RecomputeRegion& r : segment.recompute)
    if (item >= r.begin && item < r.end) return true;
  return false;
}

}  // namespace loom::lower
