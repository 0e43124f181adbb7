#include "graph/attrs.h"

#include <sstream>

namespace loom::graph {

std::string Attrs::to_string() const {
  std::ostringstream os;
  os << "{";
  bool first = true;
  for (const auto& [k, v] : values_) {
    if (!first) os << ", ";
    first = false;
    os << k << "=";
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
            os << "[";
            for (size_t i = 0; i < x.size(); ++i) os << (i ? "," : "") << x[i];
            os << "]";
          } else if constexpr (std::is_same_v<T, bool>) {
            os << (x ? "true" : "false");
          } else {
            os << x;
          }
        },
        v);
  }
  os << "}";
  return os.str();
}

}  // namespace loom::graph
