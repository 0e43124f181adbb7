#include "planner/cost.h"

#include <algorithm>

#include "graph/ops_context.h"
#include "graph/transform.h"

namespace loom::planner {

double op_flops(const graph::Op& op) {
  auto sizes = graph::label_sizes(op);
  if (!sizes.ok()) return 0;
  auto size = [&](const char* l) {
    auto it = sizes->find(l);
    return it == sizes->end() ? 1.0 : static_cast<double>(it->second);
  };
  const std::string& t = op.type();
  if (t == "linear") {  // 2 x the product of every label, whatever the rank
    double f = 2.0;
    for (const auto& [label, n] : *sizes) f *= static_cast<double>(n);
    return f;
  }
  // The experts' linears compute the slots tokens fill (runtime/kernels_moe.cc), about
  // `rows` of the c per expert and sample.
  if (t == "expert_linear") {
    double f = 2.0;
    for (const auto& [label, n] : *sizes) f *= static_cast<double>(n);
    return f * std::min(1.0, static_cast<double>(op.attrs().get_or<int64_t>(
                                 "rows", static_cast<int64_t>(size("c")))) /
                                 size("c"));
  }
  if (t == "window_attention")
    return 4.0 * size("b") * size("s") * size("t") * size("t") * size("h") * size("d");
  if (t == "attention" || t == "shared_kv_attention")
    return 4.0 * size("b") * size("s") * size("t") * size("h") * size("d");
  if (t == "gqa_attention")
    return 4.0 * size("b") * size("s") * size("t") * size("g") * size("r") * size("d");
  // A ring step computes its blocks with something to see (graph/ops_context.h), not s x t.
  if (t == "ring_attention_step") {
    double pairs = 0;
    for (const graph::AttentionBlock& blk : graph::ring_step_blocks(op))
      pairs += static_cast<double>(blk.q.len) * static_cast<double>(blk.k.len);
    return 4.0 * size("b") * pairs * size("g") * size("r") * size("d");
  }
  if (t == "embedding") return size("b") * size("s") * size("h");
  // The Evoformer's (graph/ops_evoformer.cc): scores and weighted sums, products over k or s.
  if (t == "row_attention" || t == "column_attention")
    return 4.0 * size("b") * size("x") * size("i") * size("j") * size("h") * size("d");
  if (t == "triangle_outgoing" || t == "triangle_incoming")
    return 2.0 * size("b") * size("i") * size("j") * size("k") * size("c");
  if (t == "outer_product_mean")
    return 2.0 * size("b") * size("s") * size("i") * size("j") * size("c") * size("e");
  // Otherwise: a few operations per element of the largest operand.
  double largest = 0;
  for (const auto& io : {&op.inputs, &op.outputs})
    for (const auto& s : *io) largest = std::max(largest, static_cast<double>(numel(s.shape())));
  return 4.0 * largest;
}

double op_output_bytes(const graph::Graph& graph, const graph::Op& op) {
  double bytes = 0;
  for (const auto& o : op.outputs)
    bytes += static_cast<double>(numel(o.shape()) * size_bytes(graph.tensor(o.tensor).dtype));
  return bytes;
}

}  // namespace loom::planner
