// What a plan's hash covers, and the refusal of a stale plan: the values of the plan's spec that
// shape a plan (PlanSpec::plan_fields), its cost model's values, the single-device model graph
// (lower::model_digest) and the code (lower::code_fingerprint). A plan whose hash differs from
// the one computed for this run is refused, naming what differs.
#pragma once

#include <string>

#include "core/config.h"
#include "core/cost_model.h"
#include "core/result.h"
#include "lower/plan_file.h"
#include "plan/plan_spec.h"

namespace loom::plan {

// The hash a plan for `spec` on `cost` made by this code from the model of `model_digest`
// carries (16 hex digits).
std::string plan_hash(const PlanSpec& spec, const CostModel& cost, const std::string& model_digest,
                      const std::string& code_fingerprint);

// Refuses a stale plan: its hash must equal the one this config, model and code give. The
// error names the file and what differs (the first plan keys with both values, the cost model,
// the code fingerprint, or the model).
Status check_plan_current(const lower::PlanFile& plan, const Config& config,
                          const std::string& model_digest, const std::string& code_fingerprint);

}  // namespace loom::plan
