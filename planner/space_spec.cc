#include "planner/space_spec.h"

namespace loom::planner {

const char* name(CpKind kind) {
  switch (kind) {
    case CpKind::kRing:
      return "p2p";
    case CpKind::kRingContiguous:
      return "p2p-contiguous";
    case CpKind::kAllToAll:
      return "all-to-all";
  }
  return "p2p";
}

std::string SpaceSpec::degrees() const {
  std::string out = "parallel.dp (" + std::to_string(mesh.dp()) + ")";
  if (ep > 1) out += " (parallel.ep " + std::to_string(ep) + " within)";
  if (mesh.cp() > 1) out += " x parallel.cp (" + std::to_string(mesh.cp()) + ")";
  return out + " x parallel.tp (" + std::to_string(mesh.tp()) + ") x parallel.pp (" +
         std::to_string(mesh.pp()) + ")";
}

}  // namespace loom::planner
