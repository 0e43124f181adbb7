#include "models/llama.h"

#include <map>

#include "core/strings.h"
#include "graph/builder.h"
#include "graph/ops_loss.h"
#include "models/model.h"

namespace loom::models {
namespace {

using graph::Attrs;
using graph::ParamInit;

LlamaSpec preset(int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads,
                 int64_t ffn_hidden, int64_t vocab, int64_t seq, double theta) {
  LlamaSpec s;
  s.layers = layers;
  s.hidden = hidden;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.ffn_hidden = ffn_hidden;
  s.vocab = vocab;
  s.seq = seq;
  s.rope_theta = theta;
  return s;
}

// Llama 3.1 trains at 8K positions and scales its rotary frequencies 8x for 128K contexts.
LlamaSpec llama31(LlamaSpec s) {
  s.rope_factor = 8;
  s.rope_low_freq_factor = 1;
  s.rope_high_freq_factor = 4;
  s.rope_original_max_positions = 8192;
  return s;
}

LlamaSpec with_moe(LlamaSpec s, int64_t experts, int64_t top_k, int64_t ffn_hidden) {
  s.moe.experts = experts;
  s.moe.top_k = top_k;
  s.moe.ffn_hidden = ffn_hidden;
  return s;
}

// DeepSeek-V3's published shape: 61 layers, the first 3 dense (width 18432), then 256 routed
// experts of width 2048 with one shared expert, top 8 by sigmoid score.
LlamaSpec deepseek_v3() {
  LlamaSpec s = with_moe(preset(61, 7168, 128, 128, 18432, 129280, 4096, 10000.0), 256, 8, 2048);
  s.moe.first_dense = 3;
  s.moe.shared_experts = 1;
  s.moe.score = "sigmoid";
  s.moe.aux_loss_coef = 0.0001;
  return s;
}

// The published shapes (Meta's model cards and Hugging Face config.json files).
const std::map<std::string, LlamaSpec>& presets() {
  static const std::map<std::string, LlamaSpec> kPresets = {
      {"tiny", preset(2, 64, 4, 2, 160, 256, 32, 10000.0)},
      {"llama3-8b", preset(32, 4096, 32, 8, 14336, 128256, 8192, 500000.0)},
      {"llama3-70b", preset(80, 8192, 64, 8, 28672, 128256, 8192, 500000.0)},
      {"llama3.1-8b", llama31(preset(32, 4096, 32, 8, 14336, 128256, 8192, 500000.0))},
      {"llama3.1-70b", llama31(preset(80, 8192, 64, 8, 28672, 128256, 8192, 500000.0))},
      {"llama3.1-405b", llama31(preset(126, 16384, 128, 8, 53248, 128256, 8192, 500000.0))},
      {"tiny-moe", with_moe(preset(2, 64, 4, 2, 160, 256, 32, 10000.0), 4, 2, 96)},
      {"mixtral-8x7b",
       with_moe(preset(32, 4096, 32, 8, 14336, 32000, 4096, 1000000.0), 8, 2, 14336)},
      {"deepseek-v3", deepseek_v3()},
  };
  return kPresets;
}

Result<LlamaSpec> apply_args(const Config& config, LlamaSpec s) {
  ModelArgs args(config);
  std::vector<std::string> known = {"layers",
                                    "hidden",
                                    "heads",
                                    "kv_heads",
                                    "vocab",
                                    "seq",
                                    "ffn_hidden",
                                    "tied",
                                    "init_std",
                                    "norm_eps",
                                    "rope_theta",
                                    "rope_factor",
                                    "rope_low_freq_factor",
                                    "rope_high_freq_factor",
                                    "rope_original_max_positions",
                                    "vocab_groups"};
  for (const std::string& name : moe_arg_names()) known.push_back(name);
  LOOM_TRY(args.check_known(known));
  LOOM_ASSIGN_OR_RETURN(s.layers, args.get_int("layers", s.layers));
  LOOM_ASSIGN_OR_RETURN(s.hidden, args.get_int("hidden", s.hidden));
  LOOM_ASSIGN_OR_RETURN(s.heads, args.get_int("heads", s.heads));
  LOOM_ASSIGN_OR_RETURN(s.kv_heads, args.get_int("kv_heads", s.kv_heads));
  LOOM_ASSIGN_OR_RETURN(s.vocab, args.get_int("vocab", s.vocab));
  LOOM_ASSIGN_OR_RETURN(s.seq, args.get_int("seq", s.seq));
  LOOM_ASSIGN_OR_RETURN(s.ffn_hidden, args.get_int("ffn_hidden", s.ffn_hidden));
  LOOM_ASSIGN_OR_RETURN(s.tied, args.get_bool("tied", s.tied));
  LOOM_ASSIGN_OR_RETURN(s.init_std, args.get_double("init_std", s.init_std));
  LOOM_ASSIGN_OR_RETURN(s.norm_eps, args.get_double("norm_eps", s.norm_eps));
  LOOM_ASSIGN_OR_RETURN(s.rope_theta, args.get_double("rope_theta", s.rope_theta));
  LOOM_ASSIGN_OR_RETURN(s.rope_factor, args.get_double("rope_factor", s.rope_factor));
  LOOM_ASSIGN_OR_RETURN(s.rope_low_freq_factor,
                        args.get_double("rope_low_freq_factor", s.rope_low_freq_factor));
  LOOM_ASSIGN_OR_RETURN(s.rope_high_freq_factor,
                        args.get_double("rope_high_freq_factor", s.rope_high_freq_factor));
  LOOM_ASSIGN_OR_RETURN(s.rope_original_max_positions,
                        args.get_int("rope_original_max_positions", s.rope_original_max_positions));
  int64_t groups = 64;  // the largest power of two up to 64 that divides the vocabulary
  while (groups > 1 && s.vocab > 0 && s.vocab % groups != 0) groups /= 2;
  LOOM_ASSIGN_OR_RETURN(s.vocab_groups, args.get_int("vocab_groups", groups));
  s.vocab_rows = pad_vocab(config, s.vocab, &s.vocab_groups);
  LOOM_ASSIGN_OR_RETURN(s.moe, moe_spec(config, s.moe, s.ffn_hidden));
  return s;
}

Status validate(const Config& config, const LlamaSpec& s) {
  auto key = [&](const std::string& name) {
    return config.model.args.count(name) ? "model.args." + name : std::string("model.preset");
  };
  auto positive = [&](const std::string& name, int64_t value) -> Status {
    if (value > 0) return Status::success();
    return config.error(key(name), name + " must be positive, got " + std::to_string(value));
  };
  for (const auto& [name, value] : std::vector<std::pair<std::string, int64_t>>{
           {"layers", s.layers},
           {"hidden", s.hidden},
           {"heads", s.heads},
           {"kv_heads", s.kv_heads},
           {"vocab", s.vocab},
           {"seq", s.seq},
           {"ffn_hidden", s.ffn_hidden},
           {"vocab_groups", s.vocab_groups},
           {"rope_original_max_positions", s.rope_original_max_positions}})
    LOOM_TRY(positive(name, value));
  for (const auto& [name, value] : std::vector<std::pair<std::string, double>>{
           {"init_std", s.init_std}, {"norm_eps", s.norm_eps}, {"rope_theta", s.rope_theta}})
    if (!(value > 0)) return config.error(key(name), name + " must be positive");
  if (s.rope_factor < 0) return config.error(key("rope_factor"), "rope_factor must be >= 0");
  if (s.rope_factor > 0 && !(s.rope_high_freq_factor > s.rope_low_freq_factor))
    return config.error(key("rope_high_freq_factor"),
                        "rope_high_freq_factor must exceed rope_low_freq_factor");
  auto divides = [&](const std::string& big, int64_t b, const std::string& small,
                     int64_t m) -> Status {
    if (b % m == 0) return Status::success();
    return config.error(key(small), big + " (" + std::to_string(b) + ") is not divisible by " +
                                        small + " (" + std::to_string(m) + ")");
  };
  LOOM_TRY(divides("hidden", s.hidden, "heads", s.heads));
  LOOM_TRY(divides("heads", s.heads, "kv_heads", s.kv_heads));
  LOOM_TRY(divides("vocab", s.vocab_rows, "vocab_groups", s.vocab_groups));
  if (s.head_dim() % 2 != 0)
    return config.error(key("heads"),
                        "rotary embeddings need an even head size, got hidden/heads = " +
                            std::to_string(s.head_dim()));
  return Status::success();
}

}  // namespace

int64_t LlamaSpec::parameter_count() const {
  const int64_t d = head_dim();
  const int64_t attention = hidden * heads * d * 2 + hidden * kv_heads * d * 2;
  int64_t n = vocab * hidden + hidden;
  for (int64_t l = 0; l < layers; ++l)
    n += attention + 2 * hidden +
         (moe.is_moe_layer(l) ? moe.layer_parameters(hidden, 3) : 3 * hidden * ffn_hidden);
  if (!tied) n += vocab * hidden;
  return n;
}

std::vector<std::string> llama_presets() {
  std::vector<std::string> out;
  for (const auto& [k, v] : presets()) out.push_back(k);
  return out;
}

Result<LlamaSpec> llama_spec(const Config& config) {
  LOOM_ASSIGN_OR_RETURN(LlamaSpec preset_spec, find_preset(config, presets(), "Llama"));
  LOOM_ASSIGN_OR_RETURN(LlamaSpec s, apply_args(config, preset_spec));
  LOOM_TRY(validate(config, s));
  LOOM_TRY(check_moe_layers(config, s.moe, s.layers));
  return s;
}

Status check_llama_parallel(const Config& config, const planner::SpaceSpec& space) {
  LOOM_ASSIGN_OR_RETURN(LlamaSpec spec, llama_spec(config));
  const int64_t tp = space.mesh.tp();
  auto key = [&](const std::string& name) {
    return config.model.args.count(name) ? "model.args." + name
                                         : "model.preset (" + config.model.preset + ") " + name;
  };
  auto refuse = [&](const std::string& name, int64_t value, const std::string& need) {
    return config.error("parallel.tp", "tensor parallelism " + std::to_string(tp) + " needs " +
                                           key(name) + " (" + std::to_string(value) + ") " + need);
  };
  const std::pair<std::string, int64_t> dims[] = {{"heads", spec.heads},
                                                  {"ffn_hidden", spec.ffn_hidden}};
  for (const auto& [name, value] : dims)
    if (value % tp != 0) return refuse(name, value, "to be divisible by " + std::to_string(tp));
  LOOM_TRY(check_vocab_split(config, space, spec.vocab, spec.vocab_groups));
  if (spec.moe.enabled() && spec.moe.ffn_hidden % tp != 0)
    return refuse("moe.ffn_hidden", spec.moe.ffn_hidden,
                  "to be divisible by " + std::to_string(tp));
  LOOM_TRY(check_expert_parallel(config, space, spec.moe));
  if (spec.kv_heads % tp != 0 && tp % spec.kv_heads != 0)
    return refuse("kv_heads", spec.kv_heads,
                  "to divide it or be divisible by it (kv heads are split, or repeated on the "
                  "ranks that share one)");
  if (space.mesh.cp() > 1 && tp > spec.kv_heads)
    return config.error("parallel.cp",
                        "context parallelism needs the kv heads split with their query heads, but "
                        "parallel.tp (" +
                            std::to_string(tp) + ") exceeds " + key("kv_heads") + " (" +
                            std::to_string(spec.kv_heads) + ")");
  return check_decoder_parallel(config, space, spec.layers, spec.seq, "kv_heads", spec.kv_heads);
}

namespace {

// Builds a Llama's graph in order: the embedding, each layer's attention and (dense or mixture
// of experts) MLP, the head and the loss.
class LlamaGraph {
 public:
  LlamaGraph(const LlamaSpec& s, int64_t tp, const graph::OpRegistry& registry)
      : s_(s),
        b_(registry, "llama"),
        std_(s.init_std),
        d_(s.head_dim()),
        group_(s.heads / s.kv_heads),
        repeat_kv_(tp > s.kv_heads),
        norm_{{"eps", s.norm_eps}},
        rope_{{"tp", std::string("column")},
              {"d", d_},
              {"theta", s.rope_theta},
              {"factor", s.rope_factor},
              {"low_freq_factor", s.rope_low_freq_factor},
              {"high_freq_factor", s.rope_high_freq_factor},
              {"original_max_positions", s.rope_original_max_positions}} {}

  Result<graph::Graph> build(int64_t batch) {
    TensorId tokens = b_.input("tokens", {batch, s_.seq}, DType::kInt64, s_.vocab);
    TensorId targets = b_.input("targets", {batch, s_.seq}, DType::kInt64, s_.vocab);
    TensorId embed = b_.parameter("embed.w", {s_.vocab_rows, s_.hidden}, ParamInit::normal(std_));
    b_.set_layer(graph::kPreLayers);
    TensorId x = b_.op1("embedding", "embed", {tokens, embed});
    TensorId aux;  // the layers' load-balancing losses so far
    for (int64_t l = 0; l < s_.layers; ++l) {
      b_.set_layer(l);
      const std::string p = "h" + std::to_string(l) + ".";
      x = attention(p, x);
      x = mlp(l, p, x, batch, aux);
    }
    b_.set_loss(head(x, embed, targets, batch, aux));
    return b_.finish();
  }

 private:
  // `tp` as in GPT: "column" splits a linear's output features, "row" its input features.
  TensorId linear(const std::string& name, TensorId in, int64_t out_f, int64_t in_f,
                  const std::string& tp_hint) {
    TensorId w = b_.parameter(name + ".w", {out_f, in_f}, ParamInit::normal(std_));
    return b_.op1("linear", name, {in, w}, Attrs{{"tp", tp_hint}});
  }

  TensorId rms_norm(const std::string& name, TensorId in) {
    TensorId w = b_.parameter(name + ".w", {s_.hidden}, ParamInit::ones());
    return b_.op1("rms_norm", name, {in, w}, norm_);
  }

  // Grouped-query attention with rotary embeddings, and its residual. More tensor-parallel
  // ranks than kv heads: every rank computes the kv heads its query heads read, from a
  // replicated projection (its gradient summed over the ranks that share it).
  TensorId attention(const std::string& p, TensorId x) {
    TensorId h = rms_norm(p + "attn_norm", x);
    TensorId q = linear(p + "attn.q", h, s_.heads * d_, s_.hidden, "column");
    const std::string kv_hint = repeat_kv_ ? "" : "column";
    TensorId k = linear(p + "attn.k", h, s_.kv_heads * d_, s_.hidden, kv_hint);
    TensorId v = linear(p + "attn.v", h, s_.kv_heads * d_, s_.hidden, kv_hint);
    q = b_.op1("rope", p + "attn.q_rope", {q}, rope_);
    Attrs k_rope = rope_;
    if (repeat_kv_) k_rope.set("tp", std::string());
    k = b_.op1("rope", p + "attn.k_rope", {k}, k_rope);
    TensorId a =
        repeat_kv_
            ? b_.op1("shared_kv_attention", p + "attn.core", {q, k, v}, Attrs{{"d", d_}})
            : b_.op1("gqa_attention", p + "attn.core", {q, k, v}, Attrs{{"d", d_}, {"r", group_}});
    TensorId o = linear(p + "attn.o", a, s_.hidden, s_.heads * d_, "row");
    return b_.op1("add", p + "attn.residual", {x, o});
  }

  TensorId swiglu_mlp(const std::string& name, TensorId h, int64_t width) {
    TensorId gate = linear(name + ".gate", h, width, s_.hidden, "column");
    TensorId up = linear(name + ".up", h, width, s_.hidden, "column");
    TensorId f = b_.op1("swiglu", name + ".act", {gate, up}, Attrs{{"tp", std::string("column")}});
    return linear(name + ".down", f, s_.hidden, width, "row");
  }

  // Layer l's MLP (dense, or a mixture of experts whose load-balancing loss joins `aux`) and its
  // residual.
  TensorId mlp(int64_t l, const std::string& p, TensorId x, int64_t batch, TensorId& aux) {
    TensorId h = rms_norm(p + "mlp_norm", x);
    if (!s_.moe.is_moe_layer(l))
      return b_.op1("add", p + "mlp.residual", {x, swiglu_mlp(p + "mlp", h, s_.ffn_hidden)});
    MoeOutput moe =
        add_moe_mlp(b_, s_.moe, p + "moe.", h, batch, s_.seq, s_.hidden, "swiglu", std_, std_);
    TensorId f = moe.out;
    if (s_.moe.shared_experts > 0) {
      TensorId shared = swiglu_mlp(p + "moe.shared", h, s_.moe.shared_experts * s_.moe.ffn_hidden);
      f = b_.op1("add", p + "moe.add_shared", {f, shared});
    }
    x = b_.op1("add", p + "mlp.residual", {x, f});
    aux = accumulate_aux(b_, aux, moe.aux, p + "moe.aux_sum");
    return x;
  }

  // The final norm, the (tied or own) head and the loss with the layers' auxiliary losses.
  TensorId head(TensorId x, TensorId embed, TensorId targets, int64_t batch, TensorId aux) {
    b_.set_layer(graph::kPostLayers);
    x = rms_norm("norm", x);
    TensorId weight =
        s_.tied ? embed
                : b_.parameter("lm_head.w", {s_.vocab_rows, s_.hidden}, ParamInit::normal(std_));
    TensorId logits =
        b_.op1("linear", "lm_head", {x, weight}, Attrs{{"tp", std::string("column")}});
    const TensorId loss =
        graph::vocab_group_loss(b_, logits, targets, s_.vocab_rows / s_.vocab_groups,
                                batch * s_.seq, s_.vocab_rows > s_.vocab ? s_.vocab : 0);
    return add_aux_loss(b_, loss, aux);
  }

  const LlamaSpec& s_;
  graph::GraphBuilder b_;
  const double std_;
  const int64_t d_;
  const int64_t group_;  // query heads per kv head
  const bool repeat_kv_;
  const Attrs norm_;
  const Attrs rope_;
};

}  // namespace

Result<graph::Graph> build_llama(const LlamaSpec& s, int64_t batch, int64_t tp,
                                 const graph::OpRegistry& registry) {
  return LlamaGraph(s, tp, registry).build(batch);
}

}  // namespace loom::models
