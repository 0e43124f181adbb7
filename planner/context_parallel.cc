#include "planner/context_parallel.h"

#include <map>
#include <memory>
#include <string>

#include "graph/ops_context.h"
#include "graph/ops_moe.h"

namespace loom::planner {
namespace {

using graph::Graph;
using graph::Op;
using graph::SubTensor;

// `piece` narrowed to sequence chunk `chunk` of length `len` (dimension 1).
SubTensor chunk_of(SubTensor piece, int64_t chunk, int64_t len) {
  piece.ranges[1] = graph::Range{chunk * len, (chunk + 1) * len};
  return piece;
}

// Appends an op of `schema`'s type (its annotation is constant) named `name` to `out`, in the
// layer and parts of `like`.
void append(Graph& out, const Op& like, const graph::OpSchema& schema, const std::string& name,
            std::vector<SubTensor> inputs, std::vector<SubTensor> outs, graph::Attrs attrs) {
  auto def = std::make_shared<graph::OpDef>();
  def->type = schema.type;
  def->name = name;
  def->annotation = *graph::Annotation::parse(schema.annotation(attrs));
  def->attrs = std::move(attrs);
  def->layer = like.layer();
  graph::carry_traits(schema, *def);
  Op op;
  op.def = std::move(def);
  op.inputs = std::move(inputs);
  op.outputs = std::move(outs);
  op.parts = like.parts;
  op.id = OpId(static_cast<int64_t>(out.ops().size()));
  out.mutable_ops().push_back(std::move(op));
}

class RingExpander {
 public:
  // `halves`: the zigzag order's (2 cp), or 0 for the sequence in order.
  RingExpander(Graph& out, const Op& op, int64_t cp, int64_t halves)
      : out_(out), op_(op), cp_(cp), halves_(halves) {}

  Status run() {
    const int64_t seq = op_.inputs[0].ranges[1].size();
    if (seq % cp_ != 0)
      return Error::at("parallel.cp", "context parallelism " + std::to_string(cp_) + " cuts the " +
                                          std::to_string(seq) + " positions of op '" + op_.name() +
                                          "' into " + std::to_string(cp_) +
                                          " chunks, which needs the " + "sequence divisible by " +
                                          std::to_string(cp_));
    if (halves_ > 0 && seq % halves_ != 0)
      return Error::at("parallel.cp",
                       "context parallelism " + std::to_string(cp_) + " in zigzag order cuts the " +
                           std::to_string(seq) + " positions of op '" + op_.name() + "' into " +
                           std::to_string(halves_) +
                           " halves, which needs the sequence divisible by " +
                           std::to_string(halves_) + " (or parallel.cp_kind=p2p-contiguous)");
    d_ = op_.attrs().get<int64_t>("d");
    const int64_t r = op_.type() == "gqa_attention" ? op_.attrs().get<int64_t>("r") : 1;
    std::pair<SubTensor, SubTensor> acc;
    for (int64_t k = 0; k < cp_; ++k) {
      const std::string at = ".ring" + std::to_string(k);
      auto step = outputs(at, nullptr);
      add(step_schema_, at, {op_.inputs[0], op_.inputs[1], op_.inputs[2]},
          {step.first, step.second},
          graph::Attrs{
              {"d", d_}, {"r", r}, {"cp", cp_}, {"cp_step", k}, {"seq", seq}, {"zigzag", halves_}});
      if (k == 0) {
        acc = step;
        continue;
      }
      const bool last = k + 1 == cp_;
      if (last) {
        add(last_schema_, at + ".merge", {acc.first, acc.second, step.first, step.second},
            {op_.outputs[0]}, graph::Attrs{{"d", d_}});
        break;
      }
      auto merged = outputs(at + ".merge", nullptr);
      add(merge_schema_, at + ".merge", {acc.first, acc.second, step.first, step.second},
          {merged.first, merged.second}, graph::Attrs{{"d", d_}});
      acc = merged;
    }
    return Status::success();
  }

 private:
  // An (output, log-sum-exp) pair of new float32 tensors.
  std::pair<SubTensor, SubTensor> outputs(const std::string& at, const SubTensor* final) {
    const Shape q = op_.inputs[0].shape();
    auto tensor = [&](const std::string& what, const Shape& shape) {
      graph::FullTensor t;
      t.name = op_.def->name + at + "." + what;
      t.shape = shape;
      t.dtype = DType::kFloat32;
      t.role = graph::TensorRole::kActivation;
      return SubTensor::full(out_.tensor(out_.add_tensor(std::move(t))));
    };
    SubTensor o = final ? *final : tensor("out", q);
    return {o, tensor("lse", Shape{q[0], q[1], q[2] / d_})};
  }

  void add(const graph::OpSchema& schema, const std::string& at, std::vector<SubTensor> inputs,
           std::vector<SubTensor> outs, graph::Attrs attrs) {
    append(out_, op_, schema, op_.def->name + at, std::move(inputs), std::move(outs),
           std::move(attrs));
  }

  Graph& out_;
  const Op& op_;
  int64_t cp_, halves_, d_ = 0;
  const graph::OpSchema step_schema_ = graph::ring_attention_step_schema();
  const graph::OpSchema merge_schema_ = graph::lse_merge_schema(false);
  const graph::OpSchema last_schema_ = graph::lse_merge_schema(true);
};

// Zigzag order's inputs: each sequence input and table of positions read through a permutation
// of its sequence, made once before its first reader.
class ZigzagInputs {
 public:
  ZigzagInputs(Graph& out, int64_t seq, int64_t halves) : out_(out), seq_(seq), halves_(halves) {}

  // `op` reading the permuted inputs in their place.
  Op rewire(Op op) {
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const graph::FullTensor& t = out_.tensor(op.inputs[i].tensor);
      const bool sequence =
          t.role == graph::TensorRole::kInput && t.shape.size() >= 2 && t.shape[1] == seq_;
      const bool positions = op.type() == "add_position" && i == 1;
      if (!sequence && !positions) continue;
      op.inputs[i] = permuted(op, op.inputs[i], positions);
    }
    return op;
  }

 private:
  SubTensor permuted(const Op& reader, const SubTensor& in, bool rows) {
    auto it = permuted_.find(in.tensor.value());
    if (it == permuted_.end()) {
      const graph::FullTensor& t = out_.tensor(in.tensor);
      graph::FullTensor p;
      p.name = t.name + ".zigzag";
      p.shape = t.shape;
      p.dtype = t.dtype;
      p.role = graph::TensorRole::kActivation;
      const SubTensor to = SubTensor::full(out_.tensor(out_.add_tensor(std::move(p))));
      const SubTensor from = SubTensor::full(out_.tensor(in.tensor));
      append(out_, reader, graph::seq_permute_schema(rows), out_.tensor(in.tensor).name + ".zigzag",
             {from}, {to}, graph::Attrs{{"zigzag", halves_}});
      it = permuted_.emplace(in.tensor.value(), to).first;
    }
    SubTensor out = it->second;
    out.ranges = in.ranges;
    return out;
  }

  Graph& out_;
  int64_t seq_, halves_;
  std::map<int64_t, SubTensor> permuted_;  // by the tensor permuted
};

// The sequence length attention sees in `g` (its queries' dimension 1), or 0 without attention.
int64_t attention_sequence(const Graph& g) {
  for (const Op& op : g.ops())
    if (op.type() == "attention" || op.type() == "gqa_attention")
      return op.inputs[0].ranges[1].size();
  return 0;
}

}  // namespace

CpOrder cp_order(CpKind kind) {
  return kind == CpKind::kRingContiguous ? CpOrder::kContiguous : CpOrder::kZigzag;
}

Result<Graph> context_parallel_attention(const Graph& g, int64_t cp, CpOrder order) {
  Graph out = g;
  out.reset_ops();
  const int64_t seq = attention_sequence(g);
  const int64_t halves = cp > 1 && order == CpOrder::kZigzag && seq > 0 ? 2 * cp : 0;
  ZigzagInputs inputs(out, seq, halves);
  for (const Op& source : g.ops()) {
    if (source.type() == "shared_kv_attention")
      return Error::at("parallel.cp", "op '" + source.name() +
                                          "' shares kv heads across tensor-parallel ranks "
                                          "(parallel.tp above the kv heads), which context "
                                          "parallelism does not split; lower parallel.tp");
    if (halves > 0 && source.type() == graph::kMoeRoute && source.attrs().has("c"))
      return Error::at("parallel.cp",
                       "op '" + source.name() +
                           "' routes tokens to experts with a capacity, dropping those past it "
                           "in sequence order, which context parallelism's zigzag order would "
                           "change; set moe.capacity_factor=0 (dropless) or "
                           "parallel.cp_kind=p2p-contiguous");
    Op op = halves > 0 ? inputs.rewire(source) : source;
    if (cp == 1 || (op.type() != "attention" && op.type() != "gqa_attention")) {
      if (halves > 0 && op.type() == "rope") {
        auto def = std::make_shared<graph::OpDef>(*op.def);
        def->attrs.set("zigzag", halves);
        op.def = std::move(def);
      }
      op.id = OpId(static_cast<int64_t>(out.ops().size()));
      out.mutable_ops().push_back(std::move(op));
      continue;
    }
    LOOM_TRY(RingExpander(out, op, cp, halves).run());
  }
  return out;
}

std::vector<Op> ring_step_parts(const Op& op) {
  const int64_t cp = op.attrs().get<int64_t>("cp"), step = op.attrs().get<int64_t>("cp_step");
  const int64_t len = op.inputs[0].ranges[1].size() / cp;
  std::vector<Op> out;
  for (int64_t c = 0; c < cp; ++c) {
    Op part = op;
    const int64_t kc = ((c - step) % cp + cp) % cp;
    part.inputs[0] = chunk_of(op.inputs[0], c, len);
    part.inputs[1] = chunk_of(op.inputs[1], kc, len);
    part.inputs[2] = chunk_of(op.inputs[2], kc, len);
    for (SubTensor& o : part.outputs) o = chunk_of(o, c, len);
    part.parts.push_back(graph::Part{static_cast<int32_t>(c), static_cast<int32_t>(cp)});
    out.push_back(std::move(part));
  }
  return out;
}

}  // namespace loom::planner
