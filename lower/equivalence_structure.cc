// The first part of the static equivalence proof: every index the rest follows (ops' ranks and
// pieces, adapters' tensors, layouts and groups, gradient syncs, each rank's segments and
// blocks) lies inside the plan, so that a damaged plan is an error, never a crash.
#include <set>
#include <string>

#include "core/strings.h"
#include "lower/equivalence_parts.h"

namespace loom::lower::proof {
namespace {

using graph::SubTensor;

// A layout valid for `shape` whose ranks lie in the world.
Status check_layout(const Layout& lay, const Shape& shape, const std::string& what, int64_t world) {
  if (auto s = lay.validate(&shape); !s.ok())
    return Error::at("plan", what + ": " + s.error().message);
  for (DeviceId d : lay.devices)
    if (d.value() < 0 || d.value() >= world)
      return Error::at("plan", what + " names rank " + d.to_string() + " outside the world of " +
                                   std::to_string(world));
  return Status::success();
}

// Every op on a rank of the world, its pieces pieces of tensors of the plan.
Status check_op_indices(const graph::Graph& g, int64_t world) {
  const int64_t tensors = static_cast<int64_t>(g.tensors().size());
  for (const graph::Op& op : g.ops()) {
    if (op.device.value() < 0 || op.device.value() >= world)
      return Error::at(op.name(), "op '" + op.name() + "' is placed on rank " +
                                      op.device.to_string() + " outside the world of " +
                                      std::to_string(world));
    for (const auto* pieces : {&op.inputs, &op.outputs})
      for (const SubTensor& p : *pieces)
        if (p.tensor.value() < 0 || p.tensor.value() >= tensors ||
            p.ranges.size() != g.tensor(p.tensor).shape.size() || p.value_chunks < 1 ||
            p.value_chunk < 0 || p.value_chunk >= p.value_chunks)
          return Error::at(op.name(), "op '" + op.name() + "' has a piece " + p.ranges_string() +
                                          " that is no piece of a tensor of the plan");
        else
          for (size_t d = 0; d < p.ranges.size(); ++d)
            if (p.ranges[d].start < 0 || p.ranges[d].start >= p.ranges[d].end ||
                p.ranges[d].end > g.tensor(p.tensor).shape[d])
              return Error::at(op.name(), "rank " + op.device.to_string() + ", op '" + op.name() +
                                              "': its piece " + p.ranges_string() + " of '" +
                                              g.tensor(p.tensor).name + "' lies outside its " +
                                              loom::to_string(g.tensor(p.tensor).shape));
  }
  return Status::success();
}

// Every adapter names a tensor, and its layouts and steps its shape and ranks of the world;
// every gradient sync names a tensor and ranks of the world.
Status check_adapter_indices(const graph::Graph& g, const Lowered& l, int64_t world) {
  const int64_t tensors = static_cast<int64_t>(g.tensors().size());
  for (const Adapter& a : l.adapters) {
    if (a.tensor.value() < 0 || a.tensor.value() >= tensors)
      return Error::at("plan", "adapter " + std::to_string(a.id) + " names no tensor");
    const Shape& shape = g.tensor(a.tensor).shape;
    const std::string what = adapter_name(g, a);
    LOOM_TRY(check_layout(a.from, shape, what + ": its producers' layout", world));
    LOOM_TRY(check_layout(a.to, shape, what + ": its consumers' layout", world));
    for (const CommPath* path : {&a.forward, &a.backward})
      for (const CommStep& st : path->steps) {
        if (st.before.factors().size() != shape.size() + 2 ||
            st.after.factors().size() != shape.size() + 2)
          return Error::at("plan", what + ": a step's layouts have the wrong number of factors");
        LOOM_TRY(check_layout(st.before, shape, what + ": a step", world));
        LOOM_TRY(check_layout(st.after, shape, what + ": a step", world));
        for (const auto& grp : st.groups)
          for (DeviceId d : grp)
            if (d.value() < 0 || d.value() >= world)
              return Error::at("plan", what + ": a step's group names rank " + d.to_string() +
                                           " outside the world");
      }
  }
  for (const GradSync& s : l.grad_syncs) {
    if (s.tensor.value() < 0 || s.tensor.value() >= tensors)
      return Error::at("plan", "a gradient sync names no tensor");
    for (DeviceId d : s.devices)
      if (d.value() < 0 || d.value() >= world)
        return Error::at("plan", "the gradient sync of '" + g.tensor(s.tensor).name +
                                     "' names rank " + d.to_string() + " outside the world");
  }
  return Status::success();
}

// Rank r's program: its own, one segment per stage of items the plan has, blocks of those
// stages and of the step's micro-batches, gradient syncs the plan has.
Status check_program_indices(const graph::Graph& g, const Lowered& l, int64_t r,
                             int64_t micro_batches) {
  const int64_t ops = static_cast<int64_t>(g.ops().size());
  const Program& p = l.programs[static_cast<size_t>(r)];
  if (p.rank.value() != r) return rank_error(r, "its program is rank " + p.rank.to_string() + "'s");
  std::set<int64_t> stages;
  for (const Segment& seg : p.segments) {
    if (!stages.insert(seg.stage.value()).second)
      return rank_error(r, "two segments of stage " + seg.stage.to_string());
    for (const SegmentItem& it : seg.items) {
      const int64_t n =
          it.kind == SegmentItem::Kind::kOp ? ops : static_cast<int64_t>(l.adapters.size());
      if (it.index < 0 || it.index >= n)
        return rank_error(r, "stage " + seg.stage.to_string() + " runs item " +
                                 std::to_string(it.index) + ", which the plan does not have");
    }
  }
  for (const ProgramBlock& b : p.blocks) {
    if (!stages.count(b.stage.value()))
      return rank_error(r, std::string("a block ") + sched::to_char(b.kind) + b.stage.to_string() +
                               "." + b.micro_batch.to_string() + " of a stage it does not run");
    if (b.micro_batch.value() < 0 || b.micro_batch.value() >= micro_batches)
      return rank_error(r, std::string("a block ") + sched::to_char(b.kind) + b.stage.to_string() +
                               "." + b.micro_batch.to_string() +
                               " of a micro-batch outside the step's " +
                               std::to_string(micro_batches));
  }
  for (int64_t s : p.grad_syncs)
    if (s < 0 || s >= static_cast<int64_t>(l.grad_syncs.size()))
      return rank_error(
          r, "joins gradient sync " + std::to_string(s) + ", which the plan does not have");
  return Status::success();
}

}  // namespace

Status check_structure(const graph::Graph& g, const Lowered& l, int64_t micro_batches) {
  const int64_t world = static_cast<int64_t>(l.programs.size());
  LOOM_TRY(check_op_indices(g, world));
  LOOM_TRY(check_adapter_indices(g, l, world));
  for (int64_t r = 0; r < world; ++r) LOOM_TRY(check_program_indices(g, l, r, micro_batches));
  return Status::success();
}

}  // namespace loom::lower::proof
