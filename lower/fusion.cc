#include "lower/fusion.h"

#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "graph/ops_loss.h"

namespace loom::lower {

std::vector<bool> fused_into_next(const graph::Graph& planned, const Lowered& lowered) {
  const auto& ops = planned.ops();
  const int64_t tensors = static_cast<int64_t>(planned.tensors().size());
  std::vector<bool> fused(ops.size(), false);
  std::unordered_set<int64_t> adapted;  // tensors some adapter moves or changes
  for (const Adapter& a : lowered.adapters) adapted.insert(a.tensor.value());
  // Readers of each weight product's output on each rank, keyed rank * tensors + tensor (only
  // such an output can be fused away: the other tensors' readers are not counted).
  std::vector<bool> linear_output(static_cast<size_t>(tensors), false);
  for (const graph::Op& op : ops)
    if (op.outputs.size() == 1 && op.def->weight_product)
      linear_output[static_cast<size_t>(op.outputs[0].tensor.value())] = true;
  std::unordered_map<int64_t, int> readers;
  for (const graph::Op& op : ops)
    for (const auto& in : op.inputs)
      if (linear_output[static_cast<size_t>(in.tensor.value())])
        ++readers[op.device.value() * tensors + in.tensor.value()];
  for (const Program& prog : lowered.programs)
    for (const Segment& seg : prog.segments)
      for (size_t i = 0; i + 1 < seg.items.size(); ++i) {
        const SegmentItem& a = seg.items[i];
        const SegmentItem& b = seg.items[i + 1];
        if (a.kind != SegmentItem::Kind::kOp || b.kind != SegmentItem::Kind::kOp) continue;
        const graph::Op& lin = ops[static_cast<size_t>(a.index)];
        const graph::Op& bias = ops[static_cast<size_t>(b.index)];
        if (!lin.def->weight_product || bias.type() != "bias_add" || lin.inputs.size() != 2 ||
            lin.outputs.size() != 1 || bias.device != lin.device)
          continue;
        const graph::SubTensor& out = lin.outputs[0];
        if (bias.inputs[0] == out && !out.is_partial() && out.tensor != planned.loss() &&
            readers[lin.device.value() * tensors + out.tensor.value()] == 1 &&
            !adapted.count(out.tensor.value())) {
          fused[static_cast<size_t>(a.index)] = true;
          ++i;  // the bias_add is taken
        }
      }
  return fused;
}

namespace {

// Readers of each tensor per rank, keyed rank * tensors + tensor.
std::unordered_map<int64_t, int> readers_per_rank(const graph::Graph& g) {
  const int64_t tensors = static_cast<int64_t>(g.tensors().size());
  std::unordered_map<int64_t, int> readers;
  for (const graph::Op& op : g.ops())
    for (const auto& in : op.inputs) ++readers[op.device.value() * tensors + in.tensor.value()];
  return readers;
}

// The chain in items [at, at + 4) of `seg`, when those four ops are one loss chain wired as
// graph::vocab_group_loss builds it; else nullopt.
std::optional<FusedLoss> chain_at(const graph::Graph& g, const Segment& seg, size_t at) {
  FusedLoss c;
  for (size_t k = at; k < at + 4; ++k) {
    const SegmentItem& it = seg.items[k];
    if (it.kind != SegmentItem::Kind::kOp) return std::nullopt;
    const std::string& type = g.ops()[static_cast<size_t>(it.index)].type();
    int64_t* slot = type == graph::kGroupLogSumExp ? &c.group_lse
                    : type == graph::kLogSumExp    ? &c.lse
                    : type == graph::kPick         ? &c.pick
                    : type == graph::kNll          ? &c.nll
                                                   : nullptr;
    if (!slot || *slot >= 0) return std::nullopt;
    *slot = it.index;
  }
  c.first = seg.items[at].index;
  auto op = [&](int64_t i) -> const graph::Op& { return g.ops()[static_cast<size_t>(i)]; };
  const graph::Op &gl = op(c.group_lse), &l = op(c.lse), &p = op(c.pick), &n = op(c.nll);
  if (gl.inputs.size() != 1 || l.inputs.size() != 1 || p.inputs.size() != 2 ||
      n.inputs.size() != 2 || gl.outputs.size() != 1 || l.outputs.size() != 1 ||
      p.outputs.size() != 1 || n.outputs.size() != 1)
    return std::nullopt;
  if (!(p.inputs[0] == gl.inputs[0]) || !(l.inputs[0] == gl.outputs[0]) ||
      !(n.inputs[0] == l.outputs[0]) || !(n.inputs[1] == p.outputs[0]))
    return std::nullopt;
  return c;
}

// Whether the chain's ops see the whole vocabulary with nothing between them that another rank
// adds to or reads: the logits piece spans the vocabulary and is no partial sum, the chain's
// inner values are whole, read by the chain alone on this rank and moved by no adapter, and no
// recomputed region cuts through it (the loss is never recomputed).
bool runs_whole(const graph::Graph& g, const Segment& seg, size_t at, const FusedLoss& c,
                const std::unordered_set<int64_t>& adapted,
                const std::unordered_map<int64_t, int>& readers) {
  const graph::Op& gl = g.ops()[static_cast<size_t>(c.group_lse)];
  const graph::SubTensor& logits = gl.inputs[0];
  const Shape& full = g.tensor(logits.tensor).shape;
  if (logits.is_partial() || logits.ranges.empty() || logits.ranges.back().start != 0 ||
      logits.ranges.back().end != full.back())
    return false;
  const int64_t tensors = static_cast<int64_t>(g.tensors().size());
  for (int64_t i : {c.group_lse, c.lse, c.pick}) {
    const graph::SubTensor& out = g.ops()[static_cast<size_t>(i)].outputs[0];
    auto r = readers.find(gl.device.value() * tensors + out.tensor.value());
    if (out.is_partial() || adapted.count(out.tensor.value()) || r == readers.end() ||
        r->second != 1 || out.tensor == g.loss())
      return false;
  }
  const auto begin = static_cast<int64_t>(at), end = begin + 4;
  for (const RecomputeRegion& region : seg.recompute)
    if (region.begin < end && begin < region.end) return false;
  return true;
}

}  // namespace

std::vector<FusedLoss> fused_losses(const graph::Graph& planned, const Lowered& lowered) {
  std::vector<FusedLoss> out;
  std::unordered_set<int64_t> adapted;
  for (const Adapter& a : lowered.adapters) adapted.insert(a.tensor.value());
  const auto readers = readers_per_rank(planned);
  for (const Program& prog : lowered.programs)
    for (const Segment& seg : prog.segments)
      for (size_t i = 0; i + 4 <= seg.items.size(); ++i) {
        const std::optional<FusedLoss> c = chain_at(planned, seg, i);
        if (!c || !runs_whole(planned, seg, i, *c, adapted, readers)) continue;
        out.push_back(*c);
        i += 3;
      }
  return out;
}

Fusion fusion_of(const graph::Graph& planned, const Lowered& lowered) {
  return {fused_into_next(planned, lowered), fused_losses(planned, lowered)};
}

}  // namespace loom::lower
