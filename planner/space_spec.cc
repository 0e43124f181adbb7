#include "planner/space_spec.h"

namespace loom::planner {
namespace {

// core/config.cc has already refused any other value.
CpKind cp_kind_of(const std::string& name) {
  if (name == "p2p-contiguous") return CpKind::kRingContiguous;
  if (name == "all-to-all") return CpKind::kAllToAll;
  return CpKind::kRing;  // p2p, ring
}

}  // namespace

Result<SpaceSpec> SpaceSpec::of(const Config& config) {
  const ParallelConfig& p = config.parallel;
  SpaceSpec spec;
  spec.policy = p.policy;
  auto mesh = DeviceMesh::make(p.dp, p.pp, p.tp, p.cp);
  if (!mesh.ok()) return config.error("parallel.dp", mesh.error().message);
  spec.mesh = *mesh;
  spec.ep = p.ep;
  spec.sp = p.sp;
  spec.cp_kind = cp_kind_of(p.cp_kind);
  spec.chunks = p.chunks;
  for (size_t k = 0; k < p.stages.size(); ++k) {
    if (p.stages[k].size() != 2)
      return config.error("parallel.stages",
                          "entry " + std::to_string(k) + " must be [first_layer, last_layer]");
    spec.stages.push_back({p.stages[k][0], p.stages[k][1]});
  }
  return spec;
}

}  // namespace loom::planner
