#include "graph/ops_moe.h"

#include <algorithm>

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
    s.rules.discrete = type == std::string(kMoeRoute);  // the top-k choice of experts
    schemas.push_back(std::move(s));
  }
  schemas.push_back(OpSchema::simple(kMoeDispatch, kMoeDispatchAnnotation));
  // The experts' linears compute the slots tokens fill (runtime/kernels_moe.cc), about `rows`
  // of the c per expert and sample; tensor parallelism splits them as a linear.
  OpSchema expert_linear = OpSchema::simple(kExpertLinear, kExpertLinearAnnotation);
  expert_linear.rules.flops = [](const FlopsInput& in) {
    const double slots = in("c");
    const auto rows =
        static_cast<double>(in.attrs.get_or<int64_t>("rows", static_cast<int64_t>(slots)));
    return 2.0 * in.product() * std::min(1.0, rows / slots);
  };
  expert_linear.rules.tensor_parallel = tp_by_hint("n", "k");
  schemas.push_back(std::move(expert_linear));
  // The experts' row-parallel outputs are partial sums: combine reduce-scatters them over the
  // hidden features instead of all-reducing the whole slots buffer.
  OpSchema combine = OpSchema::simple(kMoeCombine, kMoeCombineAnnotation);
  combine.rules.tensor_parallel = tp_split("m");
  schemas.push_back(std::move(combine));
  for (OpSchema& s : schemas) {
    Status st = registry.add(std::move(s));
    LOOM_CHECK(st.ok()) << st.error().message;
  }
}

}  // namespace loom::graph
