#include "plan/model_check.h"

#include "plan/plan_spec.h"

namespace loom::plan {

Status check_model(const Config& config, const models::ModelRegistry& models) {
  LOOM_ASSIGN_OR_RETURN(const PlanSpec spec, PlanSpec::of(config));
  LOOM_ASSIGN_OR_RETURN(const models::ModelType* type, models.of(config));
  Status s = models::check_parallel(config, spec.space, *type);
  if (!s.ok()) return config.locate(s.error());
  return s;
}

}  // namespace loom::plan
