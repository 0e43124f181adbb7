#include "graph/op_rules.h"

#include <utility>

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

}  // namespace loom::graph
