#include "planner/context_parallel.h"

#include <memory>
#include <string>

#include "graph/ops_context.h"

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

class RingExpander {
 public:
  RingExpander(Graph& out, const Op& op, int64_t cp) : out_(out), op_(op), cp_(cp) {}

  Status run() {
    const int64_t seq = op_.inputs[0].ranges[1].size();
    if (seq % cp_ != 0)
      return Error::at("parallel.cp", "context parallelism " + std::to_string(cp_) + " cuts the " +
                                          std::to_string(seq) + " positions of op '" + op_.name() +
                                          "' into " + std::to_string(cp_) +
                                          " chunks, which needs the " + "sequence divisible by " +
                                          std::to_string(cp_));
    d_ = op_.attrs().get<int64_t>("d");
    const int64_t r = op_.type() == "gqa_attention" ? op_.attrs().get<int64_t>("r") : 1;
    std::pair<SubTensor, SubTensor> acc;
    for (int64_t k = 0; k < cp_; ++k) {
      const std::string at = ".ring" + std::to_string(k);
      auto step = outputs(at, nullptr);
      add(step_schema_, at, {op_.inputs[0], op_.inputs[1], op_.inputs[2]},
          {step.first, step.second},
          graph::Attrs{{"d", d_}, {"r", r}, {"cp", cp_}, {"cp_step", k}});
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

  // An op of `schema`'s type (its annotation is constant).
  void add(const graph::OpSchema& schema, const std::string& at, std::vector<SubTensor> inputs,
           std::vector<SubTensor> outs, graph::Attrs attrs) {
    auto def = std::make_shared<graph::OpDef>();
    def->type = schema.type;
    def->name = op_.def->name + at;
    def->annotation = *graph::Annotation::parse(schema.annotation(attrs));
    def->attrs = std::move(attrs);
    def->layer = op_.layer();
    def->attention_core = schema.attention_core;
    def->rules = schema.rules;
    Op op;
    op.def = std::move(def);
    op.inputs = std::move(inputs);
    op.outputs = std::move(outs);
    op.parts = op_.parts;
    op.id = OpId(static_cast<int64_t>(out_.ops().size()));
    out_.mutable_ops().push_back(std::move(op));
  }

  Graph& out_;
  const Op& op_;
  int64_t cp_, d_ = 0;
  const graph::OpSchema step_schema_ = graph::ring_attention_step_schema();
  const graph::OpSchema merge_schema_ = graph::lse_merge_schema(false);
  const graph::OpSchema last_schema_ = graph::lse_merge_schema(true);
};

}  // namespace

Result<Graph> context_parallel_attention(const Graph& g, int64_t cp) {
  Graph out = g;
  out.mutable_ops().clear();
  for (const Op& op : g.ops()) {
    if (op.type() == "shared_kv_attention")
      return Error::at("parallel.cp", "op '" + op.name() +
                                          "' shares kv heads across tensor-parallel ranks "
                                          "(parallel.tp above the kv heads), which context "
                                          "parallelism does not split; lower parallel.tp");
    if (cp == 1 || (op.type() != "attention" && op.type() != "gqa_attention")) {
      Op copy = op;
      copy.id = OpId(static_cast<int64_t>(out.ops().size()));
      out.mutable_ops().push_back(std::move(copy));
      continue;
    }
    LOOM_TRY(RingExpander(out, op, cp).run());
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
