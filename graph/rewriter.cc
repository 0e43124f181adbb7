#include "graph/rewriter.h"

#include "core/debug_env.h"
#include "graph/transform.h"
#include "graph/verify.h"

namespace loom::graph {
namespace {

// Whether `a` lies inside `b`: the same tensor, every range inside b's, and a's value chunk
// inside b's (chunk c of m is the interval [c/m, (c+1)/m) of the value).
bool within(const SubTensor& a, const SubTensor& b) {
  if (a.tensor != b.tensor || a.ranges.size() != b.ranges.size()) return false;
  for (size_t d = 0; d < a.ranges.size(); ++d)
    if (a.ranges[d].start < b.ranges[d].start || a.ranges[d].end > b.ranges[d].end) return false;
  return a.value_chunk * b.value_chunks >= b.value_chunk * a.value_chunks &&
         (a.value_chunk + 1) * b.value_chunks <= (b.value_chunk + 1) * a.value_chunks;
}

// "[0:2, 0:8], [2:4, 0:8]", the first few.
std::string pieces_string(const std::vector<const SubTensor*>& pieces) {
  constexpr size_t kShown = 8;
  std::string out;
  for (size_t i = 0; i < pieces.size() && i < kShown; ++i)
    out += (i ? ", " : "") + pieces[i]->ranges_string();
  if (pieces.size() > kShown) out += ", ... (" + std::to_string(pieces.size()) + " in all)";
  return out.empty() ? "nothing" : out;
}

}  // namespace

VerifyMode default_verify_mode() {
#ifdef NDEBUG
  constexpr int64_t kBuildDefault = 0;
#else
  constexpr int64_t kBuildDefault = 1;
#endif
  return debug_env_int("LOOM_VERIFY_EACH_TRANSFORM", kBuildDefault) != 0
             ? VerifyMode::kEachTransform
             : VerifyMode::kOff;
}

Rewriter::Rewriter(const Graph& graph, std::string pass, VerifyMode mode)
    : graph_(&graph), pass_(std::move(pass)), mode_(mode) {}

std::string Rewriter::describe(const std::string& name, const Op& op,
                               const std::string& args) const {
  return name + "(op '" + op.name() + "'" + (args.empty() ? "" : ", " + args) + ")";
}

Status Rewriter::check_parts(const std::string& transform, const Op& op,
                             const std::vector<Op>& parts) const {
  const std::string where = pass_ + ": " + transform;
  auto fail = [&](const std::string& why) { return Error::at(op.name(), where + ": " + why); };
  for (const Op& p : parts) {
    if (p.type() != op.type())
      return fail("part '" + p.name() + "' is a " + p.type() + ", not a " + op.type());
    if (p.inputs.size() != op.inputs.size() || p.outputs.size() != op.outputs.size())
      return fail("part '" + p.name() + "' has " + std::to_string(p.inputs.size()) +
                  " inputs and " + std::to_string(p.outputs.size()) + " outputs, the op " +
                  std::to_string(op.inputs.size()) + " and " + std::to_string(op.outputs.size()));
    if (Status s = verify_op(*graph_, p); !s.ok()) return fail(s.error().message);
    for (size_t i = 0; i < p.inputs.size(); ++i)
      if (!within(p.inputs[i], op.inputs[i]))
        return fail("part '" + p.name() + "' reads " + p.inputs[i].ranges_string() + " of '" +
                    graph_->tensor(p.inputs[i].tensor).name + "', outside the piece " +
                    op.inputs[i].ranges_string() + " of '" +
                    graph_->tensor(op.inputs[i].tensor).name + "' the op read");
    for (size_t o = 0; o < p.outputs.size(); ++o)
      if (!within(p.outputs[o], op.outputs[o]))
        return fail("part '" + p.name() + "' writes " + p.outputs[o].ranges_string() + " of '" +
                    graph_->tensor(p.outputs[o].tensor).name + "', outside the piece " +
                    op.outputs[o].ranges_string() + " of '" +
                    graph_->tensor(op.outputs[o].tensor).name + "' the op wrote");
  }
  // What the op wrote, its consumers may read: the parts together must still make it.
  std::vector<const SubTensor*> have;
  for (size_t o = 0; o < op.outputs.size(); ++o) {
    have.clear();
    for (const Op& p : parts) have.push_back(&p.outputs[o]);
    if (!coverable(op.outputs[o], have))
      return Error::at(op.name(), where + " left '" + graph_->tensor(op.outputs[o].tensor).name +
                                      "' unproducible: the parts write " + pieces_string(have) +
                                      " of the piece " + op.outputs[o].ranges_string() +
                                      " the op wrote");
  }
  return Status::success();
}

Result<std::vector<Op>> Rewriter::partition(const Op& op, const std::string& label,
                                            int64_t n) const {
  auto parts = split_op(op, label, n);
  if (!parts.ok() || mode_ == VerifyMode::kOff) return parts;
  LOOM_TRY(check_parts(describe("partition", op, "dim " + label + ", " + std::to_string(n)), op,
                       *parts));
  return parts;
}

Result<std::vector<Op>> Rewriter::replicate(const Op& op, int64_t n) const {
  if (n < 1)
    return Error::at(op.name(),
                     "cannot replicate op '" + op.name() + "' " + std::to_string(n) + " times");
  std::vector<Op> parts = replicate_op(op, n);
  if (mode_ == VerifyMode::kOff) return parts;
  LOOM_TRY(check_parts(describe("replicate", op, std::to_string(n)), op, parts));
  return parts;
}

Status Rewriter::assign(Op& op, DeviceId device, int64_t devices) const {
  if (!device.valid() || device.value() >= devices)
    return Error::at(op.name(), pass_ + ": " +
                                    describe("assign", op, "device " + device.to_string()) +
                                    ": the plan has " + std::to_string(devices) + " devices");
  op.device = device;
  return Status::success();
}

Status Rewriter::stage(Op& op, StageId stage, int64_t stages) const {
  if (!stage.valid() || stage.value() >= stages)
    return Error::at(op.name(), pass_ + ": " + describe("stage", op, "stage " + stage.to_string()) +
                                    ": the plan has " + std::to_string(stages) + " stages");
  op.stage = stage;
  return Status::success();
}

Result<std::vector<Op>> Rewriter::rewrite(const std::string& name, const std::string& args,
                                          const Op& op, const OpTransform& transform) const {
  auto parts = transform(op);
  if (!parts.ok() || mode_ == VerifyMode::kOff) return parts;
  LOOM_TRY(check_parts(describe(name, op, args), op, *parts));
  return parts;
}

Result<Graph> Rewriter::apply(const std::string& name, const Graph& graph,
                              const std::function<Result<Graph>(const Graph&)>& transform) const {
  auto out = transform(graph);
  if (!out.ok() || mode_ == VerifyMode::kOff) return out;
  if (Status s = verify(*out); !s.ok())
    return Error::at(s.error().key, pass_ + ": " + name + ": " + s.error().message);
  return out;
}

}  // namespace loom::graph
