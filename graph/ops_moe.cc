#include "graph/ops_moe.h"

#include "core/check.h"

namespace loom::graph {

void add_moe_ops(OpRegistry& registry) {
  std::vector<OpSchema> schemas;
  // Gates and load statistics stay float32 under bf16: the loss sums them, and a bf16 gate
  // would move which tokens a capacity drops.
  for (auto [type, annotation] :
       {std::pair{kMoeRoute, kMoeRouteAnnotation},
        std::pair{kMoeLoadStats, kMoeLoadStatsAnnotation},
        std::pair{kMoeAuxLoss, kMoeAuxLossAnnotation}, std::pair{kAddLoss, kAddLossAnnotation}}) {
    OpSchema s = OpSchema::simple(type, annotation);
    s.fp32_outputs = true;
    schemas.push_back(std::move(s));
  }
  schemas.push_back(OpSchema::simple(kMoeDispatch, kMoeDispatchAnnotation));
  schemas.push_back(OpSchema::simple(kExpertLinear, kExpertLinearAnnotation));
  schemas.push_back(OpSchema::simple(kMoeCombine, kMoeCombineAnnotation));
  for (OpSchema& s : schemas) {
    Status st = registry.add(std::move(s));
    LOOM_CHECK(st.ok()) << st.error().message;
  }
}

}  // namespace loom::graph
