#include "lower/recompute.h"

#include <set>

#include "lower/fusion.h"

namespace loom::lower {

Result<Recompute> parse_recompute(const std::string& text) {
  if (text == "none") return Recompute::kNone;
  if (text == "selective") return Recompute::kSelective;
  if (text == "full") return Recompute::kFull;
  return Error::at("parallel.recompute", "must be none, selective or full, got '" + text + "'");
}

const char* name(Recompute mode) {
  switch (mode) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "none";
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

void mark_recompute(const graph::Graph& planned, Lowered& lowered, Recompute mode,
                    const std::vector<bool>* fused_ops) {
  std::vector<bool> own_fused;
  if (mode == Recompute::kSelective && !fused_ops) own_fused = fused_into_next(planned, lowered);
  const std::vector<bool>& fused = fused_ops ? *fused_ops : own_fused;
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

AdapterReads adapter_reads(const Lowered& lowered) {
  AdapterReads out;
  for (const Adapter& a : lowered.adapters)
    for (const std::string& c : a.consumers) out.insert({a.tensor.value(), c});
  return out;
}

ProgramReaders::ProgramReaders(const graph::Graph& g, const Lowered& lowered,
                               const AdapterReads& reads, const Program& prog)
    : graph_(g), lowered_(lowered), program_(prog) {
  for (size_t s = 0; s < prog.segments.size(); ++s)
    for (size_t i = 0; i < prog.segments[s].items.size(); ++i) {
      const Position at{s, static_cast<int64_t>(i)};
      const SegmentItem& it = prog.segments[s].items[i];
      if (it.kind == SegmentItem::Kind::kAdapter) {
        direct_[lowered.adapters[static_cast<size_t>(it.index)].tensor.value()].push_back(at);
        continue;
      }
      const graph::Op& op = g.ops()[static_cast<size_t>(it.index)];
      for (const auto& in : op.inputs) {
        std::pair<int64_t, std::string> key{in.tensor.value(), op.def->name};
        if (reads.count(key))
          through_[std::move(key)].push_back(at);
        else
          direct_[in.tensor.value()].push_back(at);
      }
    }
}

RegionBorder ProgramReaders::border(size_t segment, const RecomputeRegion& region) const {
  auto read_outside = [&](const std::vector<Position>& readers) {
    for (const Position& p : readers)
      if (p.segment != segment || p.item < region.begin || p.item >= region.end) return true;
    return false;
  };
  RegionBorder out;
  const Segment& seg = program_.segments[segment];
  for (int64_t i = region.begin; i < region.end; ++i) {
    const SegmentItem& it = seg.items[static_cast<size_t>(i)];
    if (it.kind == SegmentItem::Kind::kAdapter) {
      const Adapter& a = lowered_.adapters[static_cast<size_t>(it.index)];
      for (const std::string& c : a.consumers) {
        const auto readers = through_.find({a.tensor.value(), c});
        if (readers != through_.end() && read_outside(readers->second)) {
          out.adapters.push_back(a.id);
          break;
        }
      }
      continue;
    }
    for (const auto& made : graph_.ops()[static_cast<size_t>(it.index)].outputs) {
      const int64_t t = made.tensor.value();
      const auto readers = direct_.find(t);
      if ((readers != direct_.end() && read_outside(readers->second)) ||
          graph_.tensor(made.tensor).role == graph::TensorRole::kLoss)
        out.tensors.push_back(t);
    }
  }
  return out;
}

RegionBorder region_border(const graph::Graph& g, const Lowered& lowered, const Program& prog,
                           size_t segment, const RecomputeRegion& region) {
  return ProgramReaders(g, lowered, adapter_reads(lowered), prog).border(segment, region);
}

bool recomputed(const Segment& segment, int64_t item) {
  for (const RecomputeRegion& r : segment.recompute)
    if (item >= r.begin && item < r.end) return true;
  return false;
}

}  // namespace loom::lower
