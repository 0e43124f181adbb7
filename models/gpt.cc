#include "models/gpt.h"

#include <cmath>
#include <map>

#include "core/strings.h"
#include "graph/builder.h"
#include "graph/ops_loss.h"
#include "models/model.h"

namespace loom::models {
namespace {

using graph::Attrs;
using graph::ParamInit;

GptSpec preset(int64_t layers, int64_t hidden, int64_t heads, int64_t vocab, int64_t seq) {
  GptSpec s;
  s.layers = layers;
  s.hidden = hidden;
  s.heads = heads;
  s.vocab = vocab;
  s.seq = seq;
  s.ffn_hidden = 4 * hidden;
  return s;
}

GptSpec tiny_moe() {
  GptSpec s = preset(2, 64, 4, 256, 32);
  s.moe.experts = 4;
  s.moe.top_k = 2;
  s.moe.ffn_hidden = 128;
  return s;
}

// Vocabularies of the published models are padded to a multiple of 128 (50257 -> 50304), as
// Megatron and nanoGPT do, so the embedding splits evenly under tensor parallelism.
const std::map<std::string, GptSpec>& presets() {
  static const std::map<std::string, GptSpec> kPresets = {
      {"tiny", preset(2, 64, 4, 256, 32)},
      {"tiny-moe", tiny_moe()},
      {"gpt2-124m", preset(12, 768, 12, 50304, 1024)},
      {"gpt3-350m", preset(24, 1024, 16, 50304, 2048)},
      {"gpt3-1.3b", preset(24, 2048, 16, 50304, 2048)},
      {"gpt3-2.7b", preset(32, 2560, 32, 50304, 2048)},
      {"gpt3-6.7b", preset(32, 4096, 32, 50304, 2048)},
      {"gpt3-13b", preset(40, 5120, 40, 50304, 2048)},
      {"gpt3-175b", preset(96, 12288, 96, 50304, 2048)},
  };
  return kPresets;
}

}  // namespace

int64_t GptSpec::parameter_count() const {
  const int64_t attention = 4 * hidden * hidden + 4 * hidden + 4 * hidden;
  const int64_t mlp = 2 * hidden * ffn_hidden + ffn_hidden + hidden;
  int64_t n = vocab * hidden + seq * hidden + 2 * hidden;
  for (int64_t l = 0; l < layers; ++l)
    n += attention + (moe.is_moe_layer(l) ? moe.layer_parameters(hidden, 2) : mlp);
  if (!tied) n += vocab * hidden;
  return n;
}

std::vector<std::string> gpt_presets() {
  std::vector<std::string> out;
  for (const auto& [k, v] : presets()) out.push_back(k);
  return out;
}

Result<GptSpec> gpt_spec(const Config& config) {
  LOOM_ASSIGN_OR_RETURN(GptSpec s, find_preset(config, presets(), "GPT"));
  ModelArgs args(config);
  std::vector<std::string> known = {"layers", "hidden",       "heads",     "vocab",
                                    "seq",    "ffn_hidden",   "tied",      "init_std",
                                    "ln_eps", "vocab_groups", "activation"};
  for (const std::string& name : moe_arg_names()) known.push_back(name);
  LOOM_TRY(args.check_known(known));
  bool ffn_given = config.model.args.count("ffn_hidden") > 0;
  LOOM_ASSIGN_OR_RETURN(s.layers, args.get_int("layers", s.layers));
  LOOM_ASSIGN_OR_RETURN(s.hidden, args.get_int("hidden", s.hidden));
  LOOM_ASSIGN_OR_RETURN(s.heads, args.get_int("heads", s.heads));
  LOOM_ASSIGN_OR_RETURN(s.vocab, args.get_int("vocab", s.vocab));
  LOOM_ASSIGN_OR_RETURN(s.seq, args.get_int("seq", s.seq));
  LOOM_ASSIGN_OR_RETURN(s.ffn_hidden, args.get_int("ffn_hidden", 4 * s.hidden));
  LOOM_ASSIGN_OR_RETURN(s.tied, args.get_bool("tied", s.tied));
  LOOM_ASSIGN_OR_RETURN(s.init_std, args.get_double("init_std", s.init_std));
  LOOM_ASSIGN_OR_RETURN(s.ln_eps, args.get_double("ln_eps", s.ln_eps));
  LOOM_ASSIGN_OR_RETURN(s.activation, args.get_string("activation", s.activation));
  int64_t groups = 64;  // the largest power of two up to 64 that divides the vocabulary
  while (groups > 1 && s.vocab > 0 && s.vocab % groups != 0) groups /= 2;
  LOOM_ASSIGN_OR_RETURN(s.vocab_groups, args.get_int("vocab_groups", groups));
  s.vocab_rows = pad_vocab(config, s.vocab, &s.vocab_groups);
  (void)ffn_given;
  LOOM_ASSIGN_OR_RETURN(s.moe, moe_spec(config, s.moe, s.ffn_hidden));

  auto key = [&](const std::string& name) {
    return config.model.args.count(name) ? "model.args." + name : std::string("model.preset");
  };
  for (auto [name, value] :
       std::vector<std::pair<std::string, int64_t>>{{"layers", s.layers},
                                                    {"hidden", s.hidden},
                                                    {"heads", s.heads},
                                                    {"vocab", s.vocab},
                                                    {"seq", s.seq},
                                                    {"ffn_hidden", s.ffn_hidden},
                                                    {"vocab_groups", s.vocab_groups}})
    if (value <= 0)
      return config.error(key(name), name + " must be positive, got " + std::to_string(value));
  if (s.init_std <= 0) return config.error(key("init_std"), "init_std must be positive");
  if (s.ln_eps <= 0) return config.error(key("ln_eps"), "ln_eps must be positive");
  if (s.activation != "gelu" && s.activation != "gelu_tanh")
    return config.error(key("activation"),
                        "activation must be gelu or gelu_tanh, got '" + s.activation + "'");
  if (s.vocab_rows % s.vocab_groups != 0)
    return config.error(key("vocab_groups"), "vocab (" + std::to_string(s.vocab) +
                                                 ") is not divisible by vocab_groups (" +
                                                 std::to_string(s.vocab_groups) + ")");
  if (s.hidden % s.heads != 0)
    return config.error(config.model.args.count("heads") ? key("heads") : key("hidden"),
                        "hidden (" + std::to_string(s.hidden) + ") is not divisible by heads (" +
                            std::to_string(s.heads) + ")");
  LOOM_TRY(check_moe_layers(config, s.moe, s.layers));
  return s;
}

Result<graph::Graph> build_gpt(const GptSpec& s, int64_t batch, const graph::OpRegistry& registry) {
  graph::GraphBuilder b(registry, "gpt");
  const double std = s.init_std;
  // GPT-2 scales the init of projections that write into the residual stream.
  const double resid_std = s.init_std / std::sqrt(2.0 * static_cast<double>(s.layers));
  const Attrs ln{{"eps", s.ln_eps}};

  TensorId tokens = b.input("tokens", {batch, s.seq}, DType::kInt64, s.vocab);
  TensorId targets = b.input("targets", {batch, s.seq}, DType::kInt64, s.vocab);
  TensorId wte = b.parameter("wte", {s.vocab_rows, s.hidden}, ParamInit::normal(std));
  TensorId wpe = b.parameter("wpe", {s.seq, s.hidden}, ParamInit::normal(std));

  b.set_layer(graph::kPreLayers);
  TensorId x = b.op1("embedding", "embed.tok", {tokens, wte});
  x = b.op1("add_position", "embed.pos", {x, wpe});

  // `tp` tells tensor-parallel policies how Megatron splits the layer: "column" splits the
  // output features, "row" the input features (its output is a partial sum).
  auto linear = [&](const std::string& name, TensorId in, int64_t out_f, int64_t in_f, double w_std,
                    const char* tp) {
    TensorId w = b.parameter(name + ".w", {out_f, in_f}, ParamInit::normal(w_std));
    TensorId bias = b.parameter(name + ".b", {out_f}, ParamInit::zeros());
    const Attrs hint{{"tp", std::string(tp)}};
    TensorId y = b.op1("linear", name, {in, w}, hint);
    return b.op1("bias_add", name + ".bias", {y, bias}, hint);
  };
  auto layer_norm = [&](const std::string& name, TensorId in) {
    TensorId g = b.parameter(name + ".w", {s.hidden}, ParamInit::ones());
    TensorId beta = b.parameter(name + ".b", {s.hidden}, ParamInit::zeros());
    return b.op1("layer_norm", name, {in, g, beta}, ln);
  };

  TensorId aux;  // the layers' load-balancing losses so far
  for (int64_t l = 0; l < s.layers; ++l) {
    b.set_layer(l);
    std::string p = "h" + std::to_string(l) + ".";
    TensorId h = layer_norm(p + "ln1", x);
    TensorId q = linear(p + "attn.q", h, s.hidden, s.hidden, std, "column");
    TensorId k = linear(p + "attn.k", h, s.hidden, s.hidden, std, "column");
    TensorId v = linear(p + "attn.v", h, s.hidden, s.hidden, std, "column");
    TensorId a = b.op1("attention", p + "attn.core", {q, k, v}, Attrs{{"d", s.head_dim()}});
    TensorId o = linear(p + "attn.proj", a, s.hidden, s.hidden, resid_std, "row");
    x = b.op1("add", p + "attn.residual", {x, o});
    h = layer_norm(p + "ln2", x);
    auto mlp = [&](const std::string& name, int64_t width) {
      TensorId f = linear(name + ".fc1", h, width, s.hidden, std, "column");
      Attrs act{{"tp", std::string("column")}};
      if (s.activation == "gelu_tanh") act.set("approximate", std::string("tanh"));
      f = b.op1("gelu", name + ".gelu", {f}, act);
      return linear(name + ".fc2", f, s.hidden, width, resid_std, "row");
    };
    if (s.moe.is_moe_layer(l)) {
      MoeOutput moe = add_moe_mlp(b, s.moe, p + "moe.", h, batch, s.seq, s.hidden, s.activation,
                                  std, resid_std);
      TensorId f = moe.out;
      if (s.moe.shared_experts > 0)
        f = b.op1("add", p + "moe.add_shared",
                  {f, mlp(p + "moe.shared", s.moe.shared_experts * s.moe.ffn_hidden)});
      x = b.op1("add", p + "mlp.residual", {x, f});
      aux = accumulate_aux(b, aux, moe.aux, p + "moe.aux_sum");
    } else {
      x = b.op1("add", p + "mlp.residual", {x, mlp(p + "mlp", s.ffn_hidden)});
    }
  }

  b.set_layer(graph::kPostLayers);
  x = layer_norm("lnf", x);
  TensorId head =
      s.tied ? wte : b.parameter("lm_head.w", {s.vocab_rows, s.hidden}, ParamInit::normal(std));
  TensorId logits = b.op1("linear", "lm_head", {x, head}, Attrs{{"tp", std::string("column")}});
  // The loss in vocabulary groups, so tensor parallelism splits it like the LM head (a rank
  // holding the whole vocabulary runs the four ops as one cross-entropy, lower/fusion.h).
  const TensorId loss =
      graph::vocab_group_loss(b, logits, targets, s.vocab_rows / s.vocab_groups, batch * s.seq,
                              s.vocab_rows > s.vocab ? s.vocab : 0);
  b.set_loss(add_aux_loss(b, loss, aux));
  return b.finish();
}

}  // namespace loom::models
