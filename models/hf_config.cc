#include "models/hf_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "core/durable_file.h"
#include "models/gpt.h"
#include "models/llama.h"

namespace loom::models {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

enum class Kind { kInt, kReal, kBool, kText };

// One model.args value config.json determines: the loom name, the Hugging Face key it came
// from (for messages) and the value as model.args text.
struct Resolved {
  std::string arg;
  std::string hf_key;
  Kind kind;
  std::string value;
};

// The shortest decimal that reads back as `v`, so model.args holds what config.json said.
std::string real_text(double v) {
  char buf[64];
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

// Reads config.json's keys with messages naming the file and the key.
class HfKeys {
 public:
  HfKeys(json j, std::string file) : j_(std::move(j)), file_(std::move(file)) {}
  const json& raw() const { return j_; }
  bool has(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }
  Error error(const std::string& key, const std::string& what) const {
    return Error::at(file_, file_ + ": " + key + ": " + what);
  }
  Result<int64_t> integer(const std::string& key, std::optional<int64_t> fallback = {}) const {
    if (!has(key)) {
      if (fallback) return *fallback;
      return error(key, "missing (model.from_hf needs it)");
    }
    if (!j_[key].is_number_integer()) return error(key, "is not an integer");
    return j_[key].get<int64_t>();
  }
  Result<double> real(const json& obj, const std::string& key, const std::string& path,
                      std::optional<double> fallback = {}) const {
    if (!obj.contains(key) || obj[key].is_null()) {
      if (fallback) return *fallback;
      return error(path, "missing (model.from_hf needs it)");
    }
    if (!obj[key].is_number()) return error(path, "is not a number");
    return obj[key].get<double>();
  }
  Result<double> real(const std::string& key, std::optional<double> fallback = {}) const {
    return real(j_, key, key, fallback);
  }
  Result<bool> boolean(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_boolean()) return error(key, "is not true or false");
    return j_[key].get<bool>();
  }
  Result<std::string> text(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_string()) return error(key, "is not a string");
    return j_[key].get<std::string>();
  }
  const std::string& file() const { return file_; }

 private:
  json j_;
  std::string file_;
};

Resolved int_arg(std::string arg, std::string key, int64_t v) {
  return {std::move(arg), std::move(key), Kind::kInt, std::to_string(v)};
}
Resolved real_arg(std::string arg, std::string key, double v) {
  return {std::move(arg), std::move(key), Kind::kReal, real_text(v)};
}
Resolved bool_arg(std::string arg, std::string key, bool v) {
  return {std::move(arg), std::move(key), Kind::kBool, v ? "true" : "false"};
}

Result<std::vector<Resolved>> gpt2_args(const HfKeys& k, int64_t* positions) {
  std::vector<Resolved> out;
  LOOM_ASSIGN_OR_RETURN(int64_t layers, k.integer("n_layer"));
  LOOM_ASSIGN_OR_RETURN(int64_t hidden, k.integer("n_embd"));
  LOOM_ASSIGN_OR_RETURN(int64_t heads, k.integer("n_head"));
  LOOM_ASSIGN_OR_RETURN(int64_t vocab, k.integer("vocab_size"));
  LOOM_ASSIGN_OR_RETURN(int64_t ffn, k.integer("n_inner", 4 * hidden));
  LOOM_ASSIGN_OR_RETURN(double eps, k.real("layer_norm_epsilon", 1e-5));
  LOOM_ASSIGN_OR_RETURN(bool tied, k.boolean("tie_word_embeddings", true));
  LOOM_ASSIGN_OR_RETURN(*positions, k.integer("n_positions"));
  LOOM_ASSIGN_OR_RETURN(std::string act, k.text("activation_function", "gelu_new"));
  // transformers' gelu_new and gelu_pytorch_tanh are the tanh approximation; gelu is exact.
  std::string activation;
  if (act == "gelu_new" || act == "gelu_pytorch_tanh")
    activation = "gelu_tanh";
  else if (act == "gelu")
    activation = "gelu";
  else
    return k.error("activation_function",
                   "'" + act + "' is not one of loom's GPT activations (gelu, gelu_new)");
  // What loom's GPT does not compute: say so rather than load a different model.
  LOOM_ASSIGN_OR_RETURN(bool scale, k.boolean("scale_attn_weights", true));
  LOOM_ASSIGN_OR_RETURN(bool by_layer, k.boolean("scale_attn_by_inverse_layer_idx", false));
  LOOM_ASSIGN_OR_RETURN(bool cross, k.boolean("add_cross_attention", false));
  if (!scale) return k.error("scale_attn_weights", "false; loom's attention scales by 1/sqrt(d)");
  if (by_layer)
    return k.error("scale_attn_by_inverse_layer_idx", "true; loom's GPT does not scale by layer");
  if (cross) return k.error("add_cross_attention", "true; loom's GPT is a decoder alone");
  out.push_back(int_arg("layers", "n_layer", layers));
  out.push_back(int_arg("hidden", "n_embd", hidden));
  out.push_back(int_arg("heads", "n_head", heads));
  out.push_back(int_arg("vocab", "vocab_size", vocab));
  out.push_back(int_arg("ffn_hidden", "n_inner", ffn));
  out.push_back(real_arg("ln_eps", "layer_norm_epsilon", eps));
  out.push_back(bool_arg("tied", "tie_word_embeddings", tied));
  out.push_back({"activation", "activation_function", Kind::kText, activation});
  return out;
}

Result<std::vector<Resolved>> llama_args(const HfKeys& k, int64_t* positions) {
  std::vector<Resolved> out;
  LOOM_ASSIGN_OR_RETURN(int64_t layers, k.integer("num_hidden_layers"));
  LOOM_ASSIGN_OR_RETURN(int64_t hidden, k.integer("hidden_size"));
  LOOM_ASSIGN_OR_RETURN(int64_t heads, k.integer("num_attention_heads"));
  LOOM_ASSIGN_OR_RETURN(int64_t kv_heads, k.integer("num_key_value_heads", heads));
  LOOM_ASSIGN_OR_RETURN(int64_t ffn, k.integer("intermediate_size"));
  LOOM_ASSIGN_OR_RETURN(int64_t vocab, k.integer("vocab_size"));
  LOOM_ASSIGN_OR_RETURN(double eps, k.real("rms_norm_eps", 1e-6));
  LOOM_ASSIGN_OR_RETURN(bool tied, k.boolean("tie_word_embeddings", false));
  LOOM_ASSIGN_OR_RETURN(*positions, k.integer("max_position_embeddings"));
  LOOM_ASSIGN_OR_RETURN(std::string act, k.text("hidden_act", "silu"));
  if (act != "silu")
    return k.error("hidden_act", "'" + act + "'; loom's Llama MLP is SwiGLU (silu)");
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    LOOM_ASSIGN_OR_RETURN(bool has_bias, k.boolean(bias, false));
    if (has_bias) return k.error(bias, "true; loom's Llama projections have no biases");
  }
  if (heads > 0 && k.has("head_dim")) {
    LOOM_ASSIGN_OR_RETURN(int64_t head_dim, k.integer("head_dim"));
    if (head_dim != hidden / heads)
      return k.error("head_dim", std::to_string(head_dim) +
                                     "; loom's Llama heads are hidden_size / "
                                     "num_attention_heads = " +
                                     std::to_string(hidden / heads) + " wide");
  }
  // transformers 5 keeps rope_theta and the scaling in rope_parameters; earlier versions wrote
  // rope_theta and rope_scaling at the top level.
  const json& j = k.raw();
  const bool nested = j.contains("rope_parameters") && j["rope_parameters"].is_object();
  const json& rope =
      nested ? j["rope_parameters"]
             : (j.contains("rope_scaling") && j["rope_scaling"].is_object() ? j["rope_scaling"]
                                                                            : json::object());
  const std::string rope_key = nested ? "rope_parameters" : "rope_scaling";
  LOOM_ASSIGN_OR_RETURN(double theta,
                        nested ? k.real(rope, "rope_theta", "rope_parameters.rope_theta", 10000.0)
                               : k.real("rope_theta", 10000.0));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"})
    if (rope.contains(key) && rope[key].is_string()) type = rope[key].get<std::string>();
  out.push_back(int_arg("layers", "num_hidden_layers", layers));
  out.push_back(int_arg("hidden", "hidden_size", hidden));
  out.push_back(int_arg("heads", "num_attention_heads", heads));
  out.push_back(int_arg("kv_heads", "num_key_value_heads", kv_heads));
  out.push_back(int_arg("ffn_hidden", "intermediate_size", ffn));
  out.push_back(int_arg("vocab", "vocab_size", vocab));
  out.push_back(real_arg("norm_eps", "rms_norm_eps", eps));
  out.push_back(
      real_arg("rope_theta", nested ? "rope_parameters.rope_theta" : "rope_theta", theta));
  out.push_back(bool_arg("tied", "tie_word_embeddings", tied));
  if (type == "llama3") {
    const std::vector<std::pair<std::string, std::string>> scaling = {
        {"rope_factor", "factor"},
        {"rope_low_freq_factor", "low_freq_factor"},
        {"rope_high_freq_factor", "high_freq_factor"},
        {"rope_original_max_positions", "original_max_position_embeddings"}};
    for (const auto& [arg, key] : scaling) {
      LOOM_ASSIGN_OR_RETURN(double v, k.real(rope, key, rope_key + "." + key));
      if (arg == "rope_original_max_positions")
        out.push_back(int_arg(arg, rope_key + "." + key, static_cast<int64_t>(v)));
      else
        out.push_back(real_arg(arg, rope_key + "." + key, v));
    }
  } else if (type == "default") {
    // No scaling, whatever the preset says (llama3.1-* presets scale).
    out.push_back(real_arg("rope_factor", rope_key + ".rope_type", 0.0));
  } else {
    return k.error(rope_key + ".rope_type",
                   "'" + type +
                       "'; loom's Llama has the default rotary embedding and Llama 3.1's "
                       "(llama3) frequency scaling");
  }
  return out;
}

// Whether model.args text `given` means the same value as `want`.
bool same_value(Kind kind, const std::string& given, const std::string& want) {
  try {
    switch (kind) {
      case Kind::kInt:
        return std::stoll(given) == std::stoll(want) &&
               given.find_first_not_of("+-0123456789") == std::string::npos;
      case Kind::kReal: {
        const double a = std::stod(given), b = std::stod(want);
        return a == b || std::fabs(a - b) <= 1e-12 * std::fabs(b);
      }
      case Kind::kBool:
        return (given == "true" || given == "True" || given == "1") == (want == "true") &&
               (given == "true" || given == "True" || given == "1" || given == "false" ||
                given == "False" || given == "0");
      case Kind::kText:
        return given == want;
    }
  } catch (const std::exception&) {
    return false;
  }
  return false;
}

Result<std::string> write_gpt2(const Config& config) {
  LOOM_ASSIGN_OR_RETURN(GptSpec s, gpt_spec(config));
  json j = {{"model_type", "gpt2"},
            {"architectures", {"GPT2LMHeadModel"}},
            {"n_layer", s.layers},
            {"n_embd", s.hidden},
            {"n_head", s.heads},
            {"n_inner", s.ffn_hidden},
            {"vocab_size", s.vocab},
            {"n_positions", s.seq},
            {"layer_norm_epsilon", s.ln_eps},
            {"activation_function", s.activation == "gelu_tanh" ? "gelu_new" : "gelu"},
            {"tie_word_embeddings", s.tied},
            // loom trains without dropout; the exported model computes what loom computed.
            {"attn_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"resid_pdrop", 0.0},
            {"initializer_range", s.init_std},
            {"dtype", "float32"}};
  // GPT-2's <|endoftext|> is 50256; a smaller vocabulary has no such token (transformers'
  // default would name one outside it).
  constexpr int64_t kEndOfText = 50256;
  j["bos_token_id"] = s.vocab > kEndOfText ? json(kEndOfText) : json(nullptr);
  j["eos_token_id"] = j["bos_token_id"];
  return j.dump(2) + "\n";
}

Result<std::string> write_llama(const Config& config) {
  LOOM_ASSIGN_OR_RETURN(LlamaSpec s, llama_spec(config));
  json rope = {{"rope_type", "default"}, {"rope_theta", s.rope_theta}};
  if (s.rope_factor > 0)
    rope = {{"rope_type", "llama3"},
            {"rope_theta", s.rope_theta},
            {"factor", s.rope_factor},
            {"low_freq_factor", s.rope_low_freq_factor},
            {"high_freq_factor", s.rope_high_freq_factor},
            {"original_max_position_embeddings", s.rope_original_max_positions}};
  json j = {{"model_type", "llama"},
            {"architectures", {"LlamaForCausalLM"}},
            {"num_hidden_layers", s.layers},
            {"hidden_size", s.hidden},
            {"num_attention_heads", s.heads},
            {"num_key_value_heads", s.kv_heads},
            {"head_dim", s.head_dim()},
            {"intermediate_size", s.ffn_hidden},
            {"vocab_size", s.vocab},
            // The positions loom trained; rotary embeddings would run past them, as in Hugging
            // Face's own fine-tunes, but the folder says what was trained.
            {"max_position_embeddings", s.seq},
            {"rms_norm_eps", s.norm_eps},
            {"rope_parameters", rope},
            {"hidden_act", "silu"},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"tie_word_embeddings", s.tied},
            {"initializer_range", s.init_std},
            {"dtype", "float32"}};
  return j.dump(2) + "\n";
}

// The model.args values `dir`/config.json determines, and its positions; errors are reported
// under `key` (the config key naming the folder).
Result<std::vector<Resolved>> folder_args(const Config& config, const std::string& key,
                                          const fs::path& dir, int64_t* positions) {
  const fs::path file = dir / "config.json";
  LOOM_ASSIGN_OR_RETURN(std::string text, read_whole_file(file));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return config.error(key, "'" + file.string() + "' is not a JSON object");
  HfKeys keys(std::move(j), file.string());
  LOOM_ASSIGN_OR_RETURN(std::string hf_type, keys.text("model_type", ""));
  const std::string want = config.model.type == "gpt" ? "gpt2" : config.model.type;
  if (config.model.type != "gpt" && config.model.type != "llama")
    return config.error(key, "model.type '" + config.model.type +
                                 "' cannot read a Hugging Face config.json (gpt and llama can)");
  if (hf_type != want)
    return config.error("model.type", "model.type is '" + config.model.type + "' but '" +
                                          file.string() + "' has model_type '" + hf_type +
                                          "' (expected '" + want + "')");
  if (config.model.type == "gpt") return gpt2_args(keys, positions);
  return llama_args(keys, positions);
}

// An explicit model.args.tied false may untie a folder whose config.json says tied: transformers
// unties such a folder when it holds its own lm_head.weight (the loader then reads it).
bool untie_allowed(const Resolved& folder, const std::string& run_value) {
  return folder.arg == "tied" && folder.value == "true" &&
         same_value(Kind::kBool, run_value, "false");
}

// seq is the run's choice; the folder's position table (`positions` rows of `file`) bounds it.
Status check_seq_fits(const Config& config, const fs::path& file, int64_t positions) {
  std::optional<int64_t> seq;
  if (config.model.args.count("seq")) {
    LOOM_ASSIGN_OR_RETURN(seq, ModelArgs(config).get_int("seq", 0));
  } else if (config.model.type == "gpt") {
    LOOM_ASSIGN_OR_RETURN(GptSpec spec, gpt_spec(config));
    seq = spec.seq;
  } else {
    LOOM_ASSIGN_OR_RETURN(LlamaSpec spec, llama_spec(config));
    seq = spec.seq;
  }
  if (seq && *seq > positions)
    return config.error(
        config.model.args.count("seq") ? "model.args.seq" : "model.preset",
        "seq " + std::to_string(*seq) + " exceeds the " + std::to_string(positions) +
            " positions of '" + file.string() + "' (" +
            (config.model.type == "gpt" ? "n_positions" : "max_position_embeddings") +
            "); set model.args.seq to at most that");
  return Status::success();
}

// checkpoint.init_from's config.json against the run's model: weights loaded into a model with
// another norm epsilon or rotary base would train silently differently from the folder's model.
// The run's values are read back through the config.json loom would write for it, so both sides
// go through one reader. A folder without config.json is left to the loader, which names it.
Status check_init_from(const Config& config) {
  const std::string& dir = config.checkpoint.init_from;
  std::error_code ec;
  if (dir.empty() || dir == config.model.from_hf ||
      (config.model.type != "gpt" && config.model.type != "llama") ||
      !fs::is_regular_file(fs::path(dir) / "config.json", ec))
    return Status::success();
  int64_t positions = 0;
  LOOM_ASSIGN_OR_RETURN(auto folder, folder_args(config, "checkpoint.init_from", dir, &positions));
  LOOM_ASSIGN_OR_RETURN(std::string run_json, hf_config_json(config));
  HfKeys run_keys(json::parse(run_json), "the run's model");
  int64_t unused = 0;
  LOOM_ASSIGN_OR_RETURN(auto run, config.model.type == "gpt" ? gpt2_args(run_keys, &unused)
                                                             : llama_args(run_keys, &unused));
  const std::string file = (fs::path(dir) / "config.json").string();
  for (const Resolved& want : folder) {
    auto have =
        std::find_if(run.begin(), run.end(), [&](const Resolved& r) { return r.arg == want.arg; });
    if (have == run.end() || same_value(want.kind, have->value, want.value) ||
        untie_allowed(want, have->value))
      continue;
    return config.error("checkpoint.init_from",
                        "'" + file + "' says " + want.hf_key + " " + want.value +
                            ", the run's model.args." + want.arg + " is " + have->value +
                            "; set model.from_hf: " + dir +
                            " (it fills model.args from the folder) or make them agree");
  }
  return check_seq_fits(config, file, positions);
}

}  // namespace

Status apply_from_hf(Config& config) {
  if (config.model.from_hf.empty()) return check_init_from(config);
  const fs::path file = fs::path(config.model.from_hf) / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    return config.error("model.from_hf", "'" + file.string() +
                                             "' is missing: model.from_hf names a Hugging Face "
                                             "model folder (with config.json)");
  int64_t positions = 0;
  LOOM_ASSIGN_OR_RETURN(auto resolved,
                        folder_args(config, "model.from_hf", config.model.from_hf, &positions));
  for (const Resolved& r : resolved) {
    const std::string key = "model.args." + r.arg;
    auto given = config.model.args.find(r.arg);
    if (given != config.model.args.end()) {
      if (!same_value(r.kind, given->second, r.value) && !untie_allowed(r, given->second))
        return config.error(key, key + " is " + given->second + " but " + r.hf_key + " in '" +
                                     file.string() + "' is " + r.value + "; remove model.args." +
                                     r.arg + " or make them agree");
      continue;
    }
    config.model.args[r.arg] = r.value;
    config.where_[key] = file.string() + " (" + r.hf_key + ", model.from_hf)";
  }
  LOOM_TRY(check_seq_fits(config, file, positions));
  return check_init_from(config);
}

Result<std::string> hf_config_json(const Config& config) {
  if (config.model.type == "gpt") return write_gpt2(config);
  if (config.model.type == "llama") return write_llama(config);
  return config.error("model.type", "model.type '" + config.model.type +
                                        "' has no Hugging Face format (gpt and llama have)");
}

}  // namespace loom::models
