#include "graph/dump.h"

#include <sstream>

namespace loom::graph {

std::string dump(const Graph& g) {
  std::ostringstream os;
  os << "graph " << g.name() << ": " << g.tensors().size() << " tensors, " << g.ops().size()
     << " ops, loss %" << g.loss() << "\n";
  for (const auto& t : g.tensors()) {
    os << "  %" << t.id << " " << t.name << " " << to_string(t.dtype) << to_string(t.shape) << " "
       << to_string(t.role);
    if (t.role == TensorRole::kParameter) os << " " << t.init.to_string();
    os << "\n";
  }
  auto pieces = [&](const std::vector<SubTensor>& subs) {
    std::string s;
    for (size_t i = 0; i < subs.size(); ++i) {
      if (i) s += ", ";
      s += "%" + subs[i].tensor.to_string() + subs[i].ranges_string();
    }
    return s;
  };
  for (const auto& op : g.ops()) {
    os << "  #" << op.id << " " << op.type() << " " << op.name() << " dev " << op.device
       << " stage " << op.stage << " layer ";
    if (op.layer() == kPreLayers)
      os << "pre";
    else if (op.layer() == kPostLayers)
      os << "post";
    else
      os << op.layer();
    os << " {" << op.annotation().to_string() << "}";
    if (!op.attrs().values().empty()) os << " " << op.attrs().to_string();
    os << "\n      " << pieces(op.inputs) << " -> " << pieces(op.outputs) << "\n";
  }
  return os.str();
}

}  // namespace loom::graph
