#include "models/model.h"

#include "core/strings.h"
#include "models/evoformer.h"
#include "models/gpt.h"
#include "models/swin.h"

namespace loom::models {

std::vector<std::string> model_types() { return {"evoformer", "gpt", "swin"}; }

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
  if (config.model.type == "evoformer") {
    LOOM_ASSIGN_OR_RETURN(EvoformerSpec spec, evoformer_spec(config));
    return build_evoformer(spec, batch, registry);
  }
  if (config.model.type == "swin") {
    LOOM_ASSIGN_OR_RETURN(SwinSpec spec, swin_spec(config));
    return build_swin(spec, batch, registry);
  }
  return unknown_type(config);
}

Status check_parallel(const Config& config) {
  if (config.model.type == "evoformer") {
    LOOM_ASSIGN_OR_RETURN(EvoformerSpec spec, evoformer_spec(config));
    return check_evoformer_parallel(config, spec);
  }
  if (config.model.type == "swin") return check_swin_parallel(config);
  if (config.model.type != "gpt") return unknown_type(config);
  LOOM_ASSIGN_OR_RETURN(GptSpec spec, gpt_spec(config));
  const int64_t tp = config.parallel.tp;
  auto key = [&](const std::string& name) {
    return config.model.args.count(name) ? "model.args." + name : "model.preset (" + config.model.preset + ") " + name;
  };
  const std::pair<std::string, int64_t> dims[] = {
      {"heads", spec.heads}, {"ffn_hidden", spec.ffn_hidden}, {"vocab_groups", spec.vocab_groups}};
  for (const auto& [name, value] : dims)
    if (value % tp != 0)
      return config.error("parallel.tp", "tensor parallelism " + std::to_string(tp) + " needs " +
                                             key(name) + " (" + std::to_string(value) +
                                             ") to be divisible by " + std::to_string(tp));
  const int64_t stages = config.parallel.pp * config.parallel.chunks;
  if (stages > spec.layers)
    return config.error("parallel.pp", "parallel.pp (" + std::to_string(config.parallel.pp) +
                                           ") x parallel.chunks (" +
                                           std::to_string(config.parallel.chunks) + ") = " +
                                           std::to_string(stages) + " stages, but the model has " +
                                           std::to_string(spec.layers) + " layers");
  return Status::success();
}

Result<graph::Graph> build_plan(const Config& config, const graph::OpRegistry& registry,
                                const planner::PolicyRegistry& policies, int64_t world_size) {
  LOOM_ASSIGN_OR_RETURN(graph::Graph single, build_model(config, registry));
  LOOM_TRY(check_parallel(config));
  return planner::plan_graph(single, {config, world_size}, policies);
}

Result<SampleItems> items_per_sample(const Config& config) {
  if (config.model.type == "gpt") {
    LOOM_ASSIGN_OR_RETURN(GptSpec spec, gpt_spec(config));
    return SampleItems{spec.seq, "tokens", "tok/s"};
  }
  if (config.model.type == "evoformer") {
    LOOM_ASSIGN_OR_RETURN(EvoformerSpec spec, evoformer_spec(config));
    return SampleItems{spec.residues, "residues", "res/s"};
  }
  if (config.model.type == "swin") return SampleItems{1, "images", "img/s"};
  return unknown_type(config);
}

}  // namespace loom::models
