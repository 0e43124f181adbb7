#include "graph/op_rules.h"

#include <optional>
#include <utility>

#include "graph/op.h"
#include "graph/precision.h"

namespace loom::graph {

double FlopsInput::operator()(const std::string& label) const {
  auto it = sizes.find(label);
  return it == sizes.end() ? 1.0 : static_cast<double>(it->second);
}

double FlopsInput::product() const {
  double p = 1;
  for (const auto& [label, n] : sizes) p *= static_cast<double>(n);
  return p;
}

FlopsRule flops_of_labels(double factor, std::vector<std::string> labels) {
  return [factor, labels = std::move(labels)](const FlopsInput& in) {
    double f = factor;
    for (const std::string& l : labels) f *= in(l);
    return f;
  };
}

FlopsRule matmul_flops() {
  return [](const FlopsInput& in) { return 2.0 * in.product(); };
}

TensorParallelRule tp_split(std::string label) {
  return [label = std::move(label)](const std::string&) { return label; };
}

TensorParallelRule tp_by_hint(std::string column, std::string row) {
  return [column = std::move(column), row = std::move(row)](const std::string& hint) {
    return hint == "column" ? column : hint == "row" ? row : std::string();
  };
}

namespace {

// The shapes of an attention's q and k ([b, s, heads x d], attribute d), and its queries over
// all heads (b x heads x s); nullopt where the op is not shaped so.
struct AttentionSizes {
  Shape q, k;
  double queries = 0;
};
std::optional<AttentionSizes> attention_sizes(const Op& op) {
  if (op.inputs.size() < 3) return std::nullopt;
  AttentionSizes a{op.inputs[0].shape(), op.inputs[1].shape(), 0};
  const int64_t d = op.attrs().get_or<int64_t>("d", 0);
  if (a.q.size() != 3 || a.k.size() != 3 || d <= 0) return std::nullopt;
  const double heads = static_cast<double>(a.q[2] / d);
  a.queries = static_cast<double>(a.q[0]) * heads * static_cast<double>(a.q[1]);
  return a;
}

}  // namespace

SavedBytesRule attention_saved_bytes() {
  return [](const SavedBytesInput& in) -> double {
    const std::optional<AttentionSizes> a = attention_sizes(in.op);
    if (!a) return 0;
    if (fused_attention(in.dtype == DType::kBFloat16, in.on_gpu))
      return 4 * a->queries + static_cast<double>(numel(a->q) * size_bytes(in.dtype));
    return 4 * (a->queries * static_cast<double>(a->k[1]) + 3 * static_cast<double>(numel(a->q)));
  };
}

SavedBytesRule ring_step_saved_bytes() {
  return [](const SavedBytesInput& in) -> double {
    const std::optional<AttentionSizes> a = attention_sizes(in.op);
    if (!a) return 0;
    return 4 * (a->queries + 2 * static_cast<double>(numel(a->q)) +
                2 * static_cast<double>(numel(a->k)));
  };
}

}  // namespace loom::graph
