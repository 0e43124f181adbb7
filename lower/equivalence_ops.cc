// The op part of the static equivalence proof (lower/equivalence.h): each sub-operator against
// its single-device op, and the sub-ops of one op together writing each of its outputs once.
#include <algorithm>
#include <map>
#include <unordered_map>

#include "graph/op_registry.h"
#include "graph/ops_context.h"
#include "lower/equivalence_parts.h"
#include "lower/region.h"

namespace loom::lower::proof {

using graph::Range;
using graph::SubTensor;

namespace {

struct SingleOp {
  const graph::Op* op = nullptr;
  std::map<std::string, int64_t> sizes;  // every label's size on one device
};

// Ops and tensors of a second copy of the model (Chimera's up pipeline: planner/chimera.h)
// carry their one-device name with a suffix from '@' on.
std::string one_device_name(const std::string& name) { return name.substr(0, name.find('@')); }

Error op_error(const graph::Op& op, const std::string& why) {
  return Error::at(op.name(), "rank " + std::to_string(op.device.value()) + ", op '" + op.name() +
                                  "' (" + op.type() + "): " + why);
}

// Step k of ring attention over N chunks: query chunk c attends to key chunk (c - k) mod N, so
// a piece of whole query chunks reads all keys, and one of query chunk c key chunk (c - k) mod N.
Status check_ring_step(const graph::Op& op, const std::map<std::string, Range>& at,
                       const SingleOp& single) {
  const int64_t cp = op.attrs().get<int64_t>("cp"), step = op.attrs().get<int64_t>("cp_step");
  const int64_t seq = single.sizes.at("s"), len = cp > 0 ? seq / cp : 0;
  const Range s = at.at("s"), t = at.at("t");
  auto ring_error = [&](const std::string& why) {
    return op_error(op, "ring attention step " + std::to_string(step) + " of " +
                            std::to_string(cp) + ": queries " + std::to_string(s.start) + ":" +
                            std::to_string(s.end) + " against keys " + std::to_string(t.start) +
                            ":" + std::to_string(t.end) + ": " + why);
  };
  if (len < 1 || len * cp != seq || s.start % len != 0 || s.end % len != 0)
    return ring_error("not whole query chunks");
  if (s.start == 0 && s.end == seq) {
    if (t.start != 0 || t.end != seq) return ring_error("all queries need all keys");
    return Status::success();
  }
  if (s.size() != len) return ring_error("more than one query chunk and not all of them");
  const int64_t c = s.start / len, kc = ((c - step) % cp + cp) % cp;
  if (t.start != kc * len || t.end != (kc + 1) * len)
    return ring_error("query chunk " + std::to_string(c) + " attends to key chunk " +
                      std::to_string(kc) + " at this step");
  return Status::success();
}

// The ranges every label of `op`'s annotation takes on its pieces, or an error naming the
// piece and label that disagree with one device's op.
Result<std::map<std::string, Range>> label_ranges(const graph::Graph& planned, const graph::Op& op,
                                                  const SingleOp& single) {
  std::map<std::string, Range> at;
  std::map<std::string, const SubTensor*> where;  // label -> the piece that bound it
  const graph::Annotation& a = op.annotation();
  // A ring attention step's queries and keys are cut by the ring, not by the annotation.
  const bool ring_step = op.type() == graph::kRingAttentionStep;
  for (int side = 0; side < 2; ++side) {
    const auto& specs = side == 0 ? a.inputs() : a.outputs();
    const auto& pieces = side == 0 ? op.inputs : op.outputs;
    for (size_t t = 0; t < specs.size(); ++t) {
      const SubTensor& piece = pieces[t];
      const std::string& tname = planned.tensor(piece.tensor).name;  // for messages
      if (piece.ranges.size() != specs[t].dims.size())
        return op_error(op, "its piece of '" + tname + "' has " +
                                std::to_string(piece.ranges.size()) + " ranges for " +
                                std::to_string(specs[t].dims.size()) + " dimensions");
      for (size_t d = 0; d < specs[t].dims.size(); ++d) {
        const auto& labels = specs[t].dims[d].labels;
        int64_t tail = 1;  // the size of the labels after the first in a group
        for (size_t i = 1; i < labels.size(); ++i)
          tail *= labels[i].kind == graph::LabelKind::kFixed ? labels[i].size
                                                             : single.sizes.at(labels[i].name);
        const Range r = piece.ranges[d];
        for (size_t i = 0; i < labels.size(); ++i) {
          const graph::Label& l = labels[i];
          const int64_t size =
              l.kind == graph::LabelKind::kFixed ? l.size : single.sizes.at(l.name);
          Range lr{0, size};
          if (i == 0) {
            if (r.start % tail != 0 || r.end % tail != 0)
              return op_error(op, (side == 0 ? "reads '" : "writes '") + tname + "' " +
                                      ranges_string(piece.ranges) + ": dimension " +
                                      std::to_string(d) + " cuts through label '" +
                                      labels[std::min<size_t>(1, labels.size() - 1)].to_string() +
                                      "', which one device's op never splits");
            lr = Range{r.start / tail, r.end / tail};
          }
          const bool whole = lr.start == 0 && lr.end == size;
          const std::string& name = l.name;  // empty for a fixed size
          const bool ring = ring_step && i == 0 && (l.name == "s" || l.name == "t");
          if (!whole && !ring &&
              (l.kind == graph::LabelKind::kFixed || l.kind == graph::LabelKind::kFrozen || i > 0))
            return op_error(op, (side == 0 ? "reads '" : "writes '") + tname + "' " +
                                    ranges_string(piece.ranges) + ", a part of label '" +
                                    l.to_string() + "' that one device's op reads whole");
          if (name.empty()) continue;
          auto [it, fresh] = at.emplace(name, lr);
          if (fresh) {
            where[name] = &piece;
          } else if (it->second != lr) {
            return op_error(op, (side == 0 ? "reads '" : "writes '") + tname + "' " +
                                    ranges_string(piece.ranges) + ", label '" + name + "' at " +
                                    std::to_string(lr.start) + ":" + std::to_string(lr.end) +
                                    ", where '" + planned.tensor(where[name]->tensor).name + "' " +
                                    where[name]->ranges_string() + " puts it at " +
                                    std::to_string(it->second.start) + ":" +
                                    std::to_string(it->second.end) +
                                    ": one device's op needs the regions of one box of its labels");
          }
        }
      }
    }
  }
  if (ring_step) LOOM_TRY(check_ring_step(op, at, single));
  // A label no output carries, if split, leaves the op computing a part of one device's.
  for (const std::string& label : a.labels()) {
    if (a.kind_of(label) != graph::LabelKind::kSplit) continue;
    bool in_output = false;
    for (const auto& s : a.sites(label)) in_output |= s.output;
    const auto it = at.find(label);
    if (!in_output && it != at.end() &&
        (it->second.start != 0 || it->second.end != single.sizes.at(label)))
      return op_error(op, "label '" + label + "' is split but no output carries it");
  }
  return at;
}

// The sub-op against its single-device op: same definition and tensors, one box of labels,
// whole inputs, and outputs holding exactly the partial sum of its reduced labels' ranges.
Result<std::map<std::string, Range>> check_op(const graph::Graph& single_g,
                                              const graph::Graph& planned, const graph::Op& op,
                                              const SingleOp& single) {
  const graph::Op& one = *single.op;
  // A plan made in this process shares its ops' definitions with the model; one read from a
  // file has its own, compared in full.
  const bool same_def = op.def == one.def;
  if (!same_def && (op.type() != one.type() || !(op.annotation() == one.annotation()) ||
                    !(op.attrs() == one.attrs())))
    return op_error(op, "is not one device's op '" + one.def->name + "' (" + one.type() + " '" +
                            one.annotation().to_string() + "' " + one.attrs().to_string() + ")");
  if (op.inputs.size() != one.inputs.size() || op.outputs.size() != one.outputs.size())
    return op_error(op, "has " + std::to_string(op.inputs.size()) + " inputs and " +
                            std::to_string(op.outputs.size()) + " outputs; one device's op " +
                            std::to_string(one.inputs.size()) + " and " +
                            std::to_string(one.outputs.size()));
  for (int side = 0; side < 2; ++side) {
    const auto& mine = side == 0 ? op.inputs : op.outputs;
    const auto& theirs = side == 0 ? one.inputs : one.outputs;
    for (size_t i = 0; i < mine.size(); ++i) {
      const graph::FullTensor& t = planned.tensor(mine[i].tensor);
      const graph::FullTensor& u = single_g.tensor(theirs[i].tensor);
      if (one_device_name(t.name) != u.name || t.shape != u.shape)
        return op_error(op, std::string(side == 0 ? "reads '" : "writes '") + t.name +
                                "' where one device's op " + (side == 0 ? "reads '" : "writes '") +
                                u.name + "'");
      if (side == 0 && mine[i].is_partial())
        return op_error(op, "reads '" + t.name + "' " + mine[i].ranges_string() +
                                ", a partial sum, where one device's op reads the whole value");
    }
  }
  LOOM_ASSIGN_OR_RETURN(auto ranges, label_ranges(planned, op, single));
  // The share of the reduction the op sums over: its outputs hold exactly that partial sum.
  Frac share{1, 1};
  for (const auto& [label, r] : ranges)
    if (op.annotation().kind_of(label) == graph::LabelKind::kReduce)
      share = share * Frac::of(r.size(), single.sizes.at(label));
  for (const SubTensor& o : op.outputs)
    if (Frac::of(1, o.value_chunks) != share)
      return op_error(op, "writes '" + planned.tensor(o.tensor).name + "' " + o.ranges_string() +
                              " as " + ValueMix::chunk(o.value_chunk, o.value_chunks).to_string() +
                              ", but it sums " + share.to_string() + " of one device's reduction" +
                              (share == Frac{1, 1} ? ": the whole value" : ""));
  return ranges;
}

// The reduced labels' ranges of `op`, in annotation order.
std::vector<Range> reduced_box(const graph::Op& op, const std::map<std::string, Range>& ranges) {
  std::vector<Range> box;
  for (const std::string& label : op.annotation().labels())
    if (op.annotation().kind_of(label) == graph::LabelKind::kReduce)
      box.push_back(ranges.at(label));
  return box;
}

struct RangesHash {
  size_t operator()(const std::vector<Range>& r) const {
    size_t h = 0;
    for (const Range& x : r) h = h * 1000003 + static_cast<size_t>(x.start * 31 + x.end);
    return h;
  }
};

// Per output box of one output: per chunk (c of m), a sub-op writing it; the boxes in the
// order first written, with a sub-op writing each.
struct OutputBoxes {
  using Chunks = std::map<std::pair<int64_t, int64_t>, size_t>;
  std::unordered_map<std::vector<Range>, Chunks, RangesHash> by_box;
  std::vector<std::vector<Range>> boxes;
  std::vector<size_t> box_writer;
};

// The boxes the sub-ops write of output `o`; sub-ops writing the same partial sum of a box must
// sum the same reduction.
Result<OutputBoxes> output_boxes(const graph::FullTensor& t, size_t o,
                                 const std::vector<const graph::Op*>& subs,
                                 const std::vector<std::vector<Range>>& reduced) {
  OutputBoxes out;
  for (size_t i = 0; i < subs.size(); ++i) {
    const SubTensor& s = subs[i]->outputs[o];
    auto [it, fresh] = out.by_box.try_emplace(s.ranges);
    if (fresh) {
      out.boxes.push_back(s.ranges);
      out.box_writer.push_back(i);
    }
    auto [c, added] = it->second.emplace(std::make_pair(s.value_chunk, s.value_chunks), i);
    if (!added && reduced[c->second] != reduced[i])
      return op_error(*subs[i], "writes '" + t.name + "' " + s.ranges_string() +
                                    " summing the reduction over " + ranges_string(reduced[i]) +
                                    " as op '" + subs[c->second]->name() +
                                    "' writes the same partial sum over " +
                                    ranges_string(reduced[c->second]));
  }
  return out;
}

// The boxes tile the whole tensor: each region of the output is written once.
Status check_boxes_tile(const graph::Op& one, const graph::FullTensor& t, const OutputBoxes& out,
                        const std::vector<const graph::Op*>& subs) {
  std::string why;
  size_t culprit = 0;
  std::vector<Range> whole;
  for (int64_t n : t.shape) whole.push_back(Range{0, n});
  if (tiles_exactly(out.boxes, whole, &why, &culprit)) return Status::success();
  if (culprit < out.boxes.size())
    return op_error(*subs[out.box_writer[culprit]],
                    "writes '" + t.name + "' " + ranges_string(out.boxes[culprit]) +
                        ", where the sub-operators of '" + one.def->name + "' " + why +
                        ": each region of its output must be written once");
  return Error::at(one.def->name, "op '" + one.def->name + "': its sub-operators write '" + t.name +
                                      "' so that " + why);
}

// On one box, the partial sums' chunks tile the value [0, 1) and their reduced ranges tile the
// whole reduction.
Status check_box_sums(const graph::Op& one, const graph::FullTensor& t,
                      const std::vector<Range>& box, const OutputBoxes::Chunks& chunks,
                      const std::vector<const graph::Op*>& subs,
                      const std::vector<std::vector<Range>>& reduced,
                      const std::vector<Range>& whole_reduction) {
  std::vector<std::vector<Range>> parts;
  std::vector<size_t> part_writer;
  Frac total{0, 1};
  for (const auto& [cm, i] : chunks) {
    parts.push_back(reduced[i]);
    part_writer.push_back(i);
    total = total + Frac::of(1, cm.second);
  }
  // Chunks c of m are disjoint intervals; they tile [0, 1) when their lengths sum to 1 and
  // no two overlap.
  std::vector<std::pair<Frac, Frac>> intervals;
  for (const auto& [cm, i] : chunks)
    intervals.push_back({Frac::of(cm.first, cm.second), Frac::of(cm.first + 1, cm.second)});
  std::sort(intervals.begin(), intervals.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  bool chain = intervals.front().first == Frac{0, 1} && intervals.back().second == Frac{1, 1};
  for (size_t k = 1; k < intervals.size(); ++k)
    chain &= intervals[k].first == intervals[k - 1].second;
  if (!chain || total != Frac{1, 1})
    return Error::at(one.def->name,
                     "op '" + one.def->name + "': the partial sums its sub-operators write of '" +
                         t.name + "' " + ranges_string(box) + " add up to " + total.to_string() +
                         " of the value" + (total == Frac{1, 1} ? " with chunks overlapping" : "") +
                         ": each partial must count exactly once");
  std::string why;
  size_t culprit = 0;
  if (whole_reduction.empty() || tiles_exactly(parts, whole_reduction, &why, &culprit))
    return Status::success();
  if (culprit < parts.size())
    return op_error(*subs[part_writer[culprit]],
                    "writes a partial sum of '" + t.name + "' " + ranges_string(box) + " over " +
                        ranges_string(parts[culprit]) +
                        " of the reduction, where the partial sums of '" + one.def->name + "' " +
                        why + ": each part of the reduction must count once");
  return Error::at(one.def->name, "op '" + one.def->name + "': the partial sums of '" + t.name +
                                      "' " + ranges_string(box) + " sum the reduction so that " +
                                      why);
}

// The sub-ops of one single-device op write each region of each output once: their output
// boxes tile the tensor, and on each box their partial sums tile the value while their
// reduced ranges tile the reduction (replicas write the same box, chunk and reduction).
Status check_cover(const graph::Graph& planned, const graph::Op& one, const SingleOp& single,
                   const std::vector<const graph::Op*>& subs,
                   const std::vector<std::vector<Range>>& reduced) {
  std::vector<Range> whole_reduction;
  for (const std::string& label : one.annotation().labels())
    if (one.annotation().kind_of(label) == graph::LabelKind::kReduce)
      whole_reduction.push_back(Range{0, single.sizes.at(label)});
  for (size_t o = 0; o < one.outputs.size(); ++o) {
    const graph::FullTensor& t = planned.tensor(subs[0]->outputs[o].tensor);
    LOOM_ASSIGN_OR_RETURN(const OutputBoxes boxes, output_boxes(t, o, subs, reduced));
    LOOM_TRY(check_boxes_tile(one, t, boxes, subs));
    for (const auto& [box, chunks] : boxes.by_box)
      LOOM_TRY(check_box_sums(one, t, box, chunks, subs, reduced, whole_reduction));
  }
  return Status::success();
}

}  // namespace

Status check_ops(const graph::Graph& single, const graph::Graph& planned, ProofStats& stats) {
  std::unordered_map<std::string, SingleOp> by_name;
  for (const graph::Op& op : single.ops()) {
    SingleOp s;
    s.op = &op;
    std::vector<Shape> shapes;
    for (const SubTensor& in : op.inputs) shapes.push_back(single.tensor(in.tensor).shape);
    auto sizes = graph::bind_labels(op.annotation(), shapes, op.attrs());
    if (!sizes.ok())
      return Error::at(op.def->name,
                       "one device's op '" + op.def->name + "': " + sizes.error().message);
    s.sizes = std::move(sizes).value();
    by_name.emplace(op.def->name, std::move(s));
  }
  std::unordered_map<std::string, std::vector<const graph::Op*>> subs;
  std::unordered_map<std::string, std::vector<std::vector<Range>>> reduced;
  for (const graph::Op& op : planned.ops()) {
    const auto it = by_name.find(one_device_name(op.def->name));
    if (it == by_name.end())
      return op_error(op, "one device's model has no op '" + op.def->name + "'");
    LOOM_ASSIGN_OR_RETURN(auto ranges, check_op(single, planned, op, it->second));
    subs[op.def->name].push_back(&op);
    reduced[op.def->name].push_back(reduced_box(op, ranges));
    ++stats.ops;
  }
  for (const graph::Op& one : single.ops())
    if (!subs.count(one.def->name))
      return Error::at(one.def->name,
                       "one device's op '" + one.def->name + "' is on no rank of the plan");
  for (const auto& [name, ops] : subs) {
    const SingleOp& one = by_name.at(one_device_name(name));
    LOOM_TRY(check_cover(planned, *one.op, one, ops, reduced.at(name)));
  }
  return Status::success();
}

}  // namespace loom::lower::proof
