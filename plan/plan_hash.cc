#include "plan/plan_hash.h"

#include <vector>

namespace loom::plan {
namespace {

using Fields = std::vector<std::pair<std::string, std::string>>;

// "a was x in the plan, is y now" for the first differing fields (of the same keys, in order).
std::string differences(const Fields& then, const Fields& now) {
  std::string what;
  int listed = 0;
  for (size_t i = 0; i < then.size() && i < now.size(); ++i) {
    if (then[i].second == now[i].second) continue;
    if (listed++ < 4)
      what += (what.empty() ? "" : "; ") + now[i].first + " was " + then[i].second +
              " in the plan, is " + now[i].second + " now";
  }
  if (listed > 4) what += "; and " + std::to_string(listed - 4) + " more keys";
  return what;
}

void add(std::string& what, const std::string& more) {
  if (!more.empty()) what += (what.empty() ? "" : "; ") + more;
}

}  // namespace

std::string plan_hash(const PlanSpec& spec, const CostModel& cost, const std::string& model_digest,
                      const std::string& code_fingerprint) {
  std::string text;
  for (const auto& [key, value] : spec.plan_fields()) text += key + "=" + value + "\n";
  return lower::digest16(text + "cost\n" + cost_model_values(cost) + "model " + model_digest +
                         "\ncode " + code_fingerprint);
}

Status check_plan_current(const lower::PlanFile& plan, const Config& config,
                          const std::string& model_digest, const std::string& code_fingerprint) {
  LOOM_ASSIGN_OR_RETURN(const PlanSpec spec, PlanSpec::of(config));
  LOOM_ASSIGN_OR_RETURN(const CostModel cost, resolve_cost_model(config));
  const std::string expected = plan_hash(spec, cost, model_digest, code_fingerprint);
  if (plan.hash == expected) return Status::success();
  // What the plan was made of, read back from the config it records.
  std::string what;
  bool spec_differs = false;
  auto then_config = parse_config(plan.config_yaml, plan.source + " (its config)");
  auto then_spec =
      then_config.ok() ? PlanSpec::of(*then_config) : Result<PlanSpec>(then_config.error());
  // Its cost model is not resolved again: that would read whatever cost.file the plan names.
  if (then_spec.ok()) {
    what = differences(then_spec->plan_fields(), spec.plan_fields());
    spec_differs = !what.empty();
  }
  if (plan.code_fingerprint != code_fingerprint)
    add(what, "made by another loom build ('" + plan.code_fingerprint + "'; this is '" +
                  code_fingerprint + "')");
  if (plan.model_digest != model_digest && !spec_differs)
    add(what, "the model graph differs (model code or model.* changed)");
  if (what.empty())
    what = "its hash " + plan.hash + " does not match " + expected +
           " (made on another cost model, cost.*, or the file was edited)";
  return Error::at(plan.source,
                   plan.source + ": stale plan: " + what + "; make it again with `loom plan`");
}

}  // namespace loom::plan
