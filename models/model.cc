#include "models/model.h"

#include "core/strings.h"
#include "models/gpt.h"

namespace loom::models {

std::vector<std::string> model_types() { return {"gpt"}; }

namespace {
Error unknown_type(const Config& config) {
  std::string msg = "unknown model type '" + config.model.type + "'";
  std::string close = closest_match(config.model.type, model_types());
  if (!close.empty()) msg += " (did you mean '" + close + "'?)";
  return config.error("model.type", msg + "; types: " + join(model_types(), ", "));
}
}  // namespace

Result<graph::Graph> build_model(const Config& config, const graph::OpRegistry& registry) {
  int64_t batch = config.batch.micro * config.parallel.dp;
  if (config.model.type == "gpt") {
    LOOM_ASSIGN_OR_RETURN(GptSpec spec, gpt_spec(config));
    return build_gpt(spec, batch, registry);
  }
  return unknown_type(config);
}

Result<int64_t> tokens_per_sample(const Config& config) {
  if (config.model.type == "gpt") {
    LOOM_ASSIGN_OR_RETURN(GptSpec spec, gpt_spec(config));
    return spec.seq;
  }
  return unknown_type(config);
}

}  // namespace loom::models
