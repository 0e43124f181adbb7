#include "models/model.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/strings.h"
#include "models/evoformer.h"
#include "models/gpt.h"
#include "models/hf_names.h"
#include "models/llama.h"
#include "models/swin.h"
#include "planner/context_parallel.h"

namespace loom::models {
namespace {

Status check_gpt_parallel(const Config& config, const planner::SpaceSpec& space) {
  LOOM_ASSIGN_OR_RETURN(GptSpec spec, gpt_spec(config));
  const int64_t tp = space.mesh.tp();
  auto key = [&](const std::string& name) {
    return config.model.args.count(name) ? "model.args." + name
                                         : "model.preset (" + config.model.preset + ") " + name;
  };
  const std::pair<std::string, int64_t> dims[] = {{"heads", spec.heads},
                                                  {"ffn_hidden", spec.ffn_hidden}};
  for (const auto& [name, value] : dims)
    if (value % tp != 0)
      return config.error("parallel.tp", "tensor parallelism " + std::to_string(tp) + " needs " +
                                             key(name) + " (" + std::to_string(value) +
                                             ") to be divisible by " + std::to_string(tp));
  LOOM_TRY(check_vocab_split(config, space, spec.vocab, spec.vocab_groups));
  if (spec.moe.enabled() && spec.moe.ffn_hidden % tp != 0)
    return config.error("parallel.tp", "tensor parallelism " + std::to_string(tp) + " needs " +
                                           key("moe.ffn_hidden") + " (" +
                                           std::to_string(spec.moe.ffn_hidden) +
                                           ") to be divisible by " + std::to_string(tp));
  LOOM_TRY(check_expert_parallel(config, space, spec.moe));
  return check_decoder_parallel(config, space, spec.layers, spec.seq, "heads", spec.heads);
}

// A model's size: `parameters`, and the args that set it, named as the config names them.
ModelSize size_of(const Config& config, double parameters,
                  const std::vector<std::pair<std::string, int64_t>>& args) {
  ModelSize size{parameters, "", ""};
  for (const auto& [name, value] : args) {
    size.shape += (size.shape.empty() ? "" : ", ") + name + " " + std::to_string(value);
    if (size.key.empty() && config.model.args.count(name)) size.key = "model.args." + name;
  }
  if (size.key.empty()) size.key = "model.preset";
  return size;
}

// A lower bound of a decoder's parameters: each layer's attention and its MLP (the dense one or
// the experts', whichever is smaller, on every layer) and the token embedding; biases and norms
// left out. In double, so that no args overflow it.
double decoder_parameters(double layers, double hidden, double attention, double mlp,
                          const MoeSpec& moe, double projections, double vocab) {
  if (moe.enabled())
    mlp = std::min(mlp, (moe.experts + moe.shared_experts) * projections * hidden *
                            static_cast<double>(moe.ffn_hidden));
  return layers * (attention + mlp) + vocab * hidden;
}

Result<ModelSize> gpt_size(const Config& config) {
  LOOM_ASSIGN_OR_RETURN(GptSpec s, gpt_spec(config));
  const double h = static_cast<double>(s.hidden);
  return size_of(config,
                 decoder_parameters(static_cast<double>(s.layers), h, 4 * h * h,
                                    2 * h * static_cast<double>(s.ffn_hidden), s.moe, 2,
                                    static_cast<double>(s.vocab)),
                 {{"layers", s.layers},
                  {"hidden", s.hidden},
                  {"ffn_hidden", s.ffn_hidden},
                  {"vocab", s.vocab}});
}

Result<ModelSize> llama_size(const Config& config) {
  LOOM_ASSIGN_OR_RETURN(LlamaSpec s, llama_spec(config));
  const double h = static_cast<double>(s.hidden);
  const double kv = static_cast<double>(s.kv_heads) * static_cast<double>(s.head_dim());
  return size_of(config,
                 decoder_parameters(static_cast<double>(s.layers), h, 2 * h * h + 2 * h * kv,
                                    3 * h * static_cast<double>(s.ffn_hidden), s.moe, 3,
                                    static_cast<double>(s.vocab)),
                 {{"layers", s.layers},
                  {"hidden", s.hidden},
                  {"ffn_hidden", s.ffn_hidden},
                  {"vocab", s.vocab}});
}

// Each block's attention projections and MLP, at its stage's width.
Result<ModelSize> swin_size(const Config& config) {
  LOOM_ASSIGN_OR_RETURN(SwinSpec s, swin_spec(config));
  double n = 0;
  for (int64_t i = 0; i < s.stages(); ++i) {
    const double c = static_cast<double>(s.embed) * std::ldexp(1.0, static_cast<int>(i));
    n += static_cast<double>(s.depths[static_cast<size_t>(i)]) *
         (4 * c * c + 2 * static_cast<double>(s.mlp_ratio) * c * c);
  }
  return size_of(config, n, {{"blocks", s.blocks()}, {"embed", s.embed}});
}

// Each block's two transitions (MSA and pair), the widest weights it has.
Result<ModelSize> evoformer_size(const Config& config) {
  LOOM_ASSIGN_OR_RETURN(EvoformerSpec s, evoformer_spec(config));
  const double widen = 2 * static_cast<double>(s.transition);
  const double cm = static_cast<double>(s.c_m), cz = static_cast<double>(s.c_z);
  return size_of(config, static_cast<double>(s.blocks) * widen * (cm * cm + cz * cz),
                 {{"blocks", s.blocks}, {"c_m", s.c_m}, {"c_z", s.c_z}});
}

ModelType gpt_type() {
  return {"gpt",
          [](const Config& c, const GraphShape& shape,
             const graph::OpRegistry& ops) -> Result<graph::Graph> {
            LOOM_ASSIGN_OR_RETURN(GptSpec spec, gpt_spec(c));
            return build_gpt(spec, shape.samples, ops);
          },
          check_gpt_parallel,
          [](const Config& c) -> Result<SampleItems> {
            LOOM_ASSIGN_OR_RETURN(GptSpec spec, gpt_spec(c));
            return SampleItems{spec.seq, "tokens", "tok/s"};
          },
          /*context_parallel=*/true,
          [](const Config& c) -> Result<int64_t> {
            LOOM_ASSIGN_OR_RETURN(GptSpec spec, gpt_spec(c));
            return spec.moe.experts;
          },
          gpt_size,
          gpt2_hf_names()};
}

ModelType evoformer_type() {
  return {"evoformer",
          [](const Config& c, const GraphShape& shape,
             const graph::OpRegistry& ops) -> Result<graph::Graph> {
            LOOM_ASSIGN_OR_RETURN(EvoformerSpec spec, evoformer_spec(c));
            return build_evoformer(spec, shape.samples, ops);
          },
          [](const Config& c, const planner::SpaceSpec& space) -> Status {
            LOOM_ASSIGN_OR_RETURN(EvoformerSpec spec, evoformer_spec(c));
            return check_evoformer_parallel(c, space, spec);
          },
          [](const Config& c) -> Result<SampleItems> {
            LOOM_ASSIGN_OR_RETURN(EvoformerSpec spec, evoformer_spec(c));
            return SampleItems{spec.residues, "residues", "res/s"};
          },
          /*context_parallel=*/false,
          /*experts=*/{},
          evoformer_size,
          /*hf_names=*/{}};
}

ModelType llama_type() {
  return {"llama",
          [](const Config& c, const GraphShape& shape,
             const graph::OpRegistry& ops) -> Result<graph::Graph> {
            LOOM_ASSIGN_OR_RETURN(LlamaSpec spec, llama_spec(c));
            return build_llama(spec, shape.samples, shape.tp, ops);
          },
          check_llama_parallel,
          [](const Config& c) -> Result<SampleItems> {
            LOOM_ASSIGN_OR_RETURN(LlamaSpec spec, llama_spec(c));
            return SampleItems{spec.seq, "tokens", "tok/s"};
          },
          /*context_parallel=*/true,
          [](const Config& c) -> Result<int64_t> {
            LOOM_ASSIGN_OR_RETURN(LlamaSpec spec, llama_spec(c));
            return spec.moe.experts;
          },
          llama_size,
          llama_hf_names()};
}

ModelType swin_type() {
  return {"swin",
          [](const Config& c, const GraphShape& shape,
             const graph::OpRegistry& ops) -> Result<graph::Graph> {
            LOOM_ASSIGN_OR_RETURN(SwinSpec spec, swin_spec(c));
            return build_swin(spec, shape.samples, ops);
          },
          check_swin_parallel,
          [](const Config&) -> Result<SampleItems> {
            return SampleItems{1, "images", "img/s"};
          },
          /*context_parallel=*/false,
          /*experts=*/{},
          swin_size,
          /*hf_names=*/{}};
}

}  // namespace

ModelRegistry ModelRegistry::with_builtin_models() {
  ModelRegistry r;
  for (ModelType t : {evoformer_type(), gpt_type(), llama_type(), swin_type()})
    LOOM_CHECK(r.add(std::move(t)).ok());
  return r;
}

Status ModelRegistry::add(ModelType type) {
  if (type.name.empty() || !type.build)
    return Error::at("model.type", "a model type needs a name and a builder");
  if (find(type.name))
    return Error::at(type.name, "model type '" + type.name + "' is already registered");
  types_.push_back(std::move(type));
  return Status::success();
}

const ModelType* ModelRegistry::find(const std::string& name) const {
  for (const auto& t : types_)
    if (t.name == name) return &t;
  return nullptr;
}

std::vector<std::string> ModelRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& t : types_) out.push_back(t.name);
  return out;
}

Result<const ModelType*> ModelRegistry::of(const Config& config) const {
  if (const ModelType* t = find(config.model.type)) return t;
  std::string msg = "unknown model type '" + config.model.type + "'";
  std::string close = closest_match(config.model.type, names());
  if (!close.empty()) msg += " (did you mean '" + close + "'?)";
  return config.error("model.type", msg + "; types: " + join(names(), ", "));
}

int64_t pad_vocab(const Config& config, int64_t vocab, int64_t* groups) {
  constexpr int64_t kMultiple = 64;  // the most groups the default takes; every tp up to it splits
  // Default groups of 8 or more already split over any tp within a node. Every plan pads alike
  // (tp 1 too), so that a checkpoint saved under one plan loads under any other.
  constexpr int64_t kNodeTp = 8;
  if (config.model.args.count("vocab_groups") || *groups % kNodeTp == 0 || vocab <= 0) return vocab;
  *groups = kMultiple;
  return (vocab + kMultiple - 1) / kMultiple * kMultiple;
}

Status check_vocab_split(const Config& config, const planner::SpaceSpec& space, int64_t vocab,
                         int64_t vocab_groups) {
  const int64_t tp = space.mesh.tp();
  if (vocab_groups % tp == 0) return Status::success();
  const std::string t = "tensor parallelism " + std::to_string(tp);
  if (config.model.args.count("vocab_groups"))
    return config.error("parallel.tp", t + " needs model.args.vocab_groups (" +
                                           std::to_string(vocab_groups) + ") to be divisible by " +
                                           std::to_string(tp));
  const int64_t padded = (vocab + 63) / 64 * 64;
  const std::string where = config.model.args.count("vocab")
                                ? "model.args.vocab"
                                : "model.preset (" + config.model.preset + ") vocab";
  return config.error("parallel.tp", t + " splits the vocabulary over the tp ranks, but " + where +
                                         " (" + std::to_string(vocab) + ") is not divisible by " +
                                         std::to_string(tp) +
                                         "; pad it (model.args.vocab=" + std::to_string(padded) +
                                         ", a multiple of 64, as Megatron does)");
}

Status check_context_parallel(const planner::SpaceSpec& space, const ModelType& type) {
  if (space.mesh.cp() > 1 && !type.context_parallel)
    return Error::at("parallel.cp",
                     "context parallelism splits a language model's sequence; "
                     "model.type '" +
                         type.name + "' has none to split (parallel.cp must be 1)");
  return Status::success();
}

Status check_parallel(const Config& config, const planner::SpaceSpec& space,
                      const ModelType& type) {
  LOOM_TRY(check_context_parallel(space, type));
  if (space.ep > 1 && !type.experts)
    return Error::at("parallel.ep", "expert parallelism splits a mixture of experts; model.type '" +
                                        type.name + "' has none (parallel.ep must be 1)");
  return type.check_parallel ? type.check_parallel(config, space) : Status::success();
}

namespace {

// parallel.cp_kind all-to-all gives each of the cp x tp ranks of a stage whole heads.
Status check_all_to_all_heads(const Config& config, const planner::SpaceSpec& space,
                              const std::string& key, int64_t heads) {
  const int64_t cp = space.mesh.cp(), tp = space.mesh.tp();
  if (!space.all_to_all_attention() || heads % (cp * tp) == 0) return Status::success();
  return config.error("parallel.cp_kind",
                      "all-to-all context parallelism gives each of the parallel.cp x "
                      "parallel.tp = " +
                          std::to_string(cp * tp) + " ranks whole heads, but " + key + " (" +
                          std::to_string(heads) + ") is not divisible by " +
                          std::to_string(cp * tp));
}

}  // namespace

Status check_decoder_parallel(const Config& config, const planner::SpaceSpec& space, int64_t layers,
                              int64_t seq, const std::string& heads_key, int64_t heads) {
  auto key = [&](const std::string& name) {
    return config.model.args.count(name) ? "model.args." + name
                                         : "model.preset (" + config.model.preset + ") " + name;
  };
  if (space.mesh.cp() > 1 && seq % space.mesh.cp() != 0)
    return config.error("parallel.cp", "context parallelism cuts the sequence into " +
                                           std::to_string(space.mesh.cp()) + " chunks, but " +
                                           key("seq") + " (" + std::to_string(seq) +
                                           ") is not divisible by " +
                                           std::to_string(space.mesh.cp()));
  if (space.ring_attention() && planner::cp_order(space.cp_kind) == planner::CpOrder::kZigzag &&
      seq % (2 * space.mesh.cp()) != 0)
    return config.error("parallel.cp",
                        "context parallelism in zigzag order cuts the sequence into " +
                            std::to_string(2 * space.mesh.cp()) + " halves, but " + key("seq") +
                            " (" + std::to_string(seq) + ") is not divisible by " +
                            std::to_string(2 * space.mesh.cp()) +
                            " (or set parallel.cp_kind=p2p-contiguous)");
  if (space.mesh.cp() > 1 && space.policy != "hybrid")
    return config.error(
        "parallel.cp",
        "context parallelism runs under parallel.policy hybrid, not '" + space.policy + "'");
  LOOM_TRY(check_all_to_all_heads(config, space, key(heads_key), heads));
  const int64_t stages = space.mesh.pp() * space.chunks;
  if (stages > layers)
    return config.error(
        "parallel.pp", "parallel.pp (" + std::to_string(space.mesh.pp()) + ") x parallel.chunks (" +
                           std::to_string(space.chunks) + ") = " + std::to_string(stages) +
                           " stages, but the model has " + std::to_string(layers) + " layers");
  return Status::success();
}

Error unknown_preset(const Config& config, const std::string& family,
                     const std::vector<std::string>& names) {
  std::string msg = "unknown " + family + " preset '" + config.model.preset + "'";
  const std::string close = closest_match(config.model.preset, names);
  if (!close.empty()) msg += " (did you mean '" + close + "'?)";
  return config.error("model.preset", msg + "; presets: " + join(names, ", "));
}

}  // namespace loom::models
