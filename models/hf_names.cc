#include "models/hf_names.h"

#include <cctype>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::models {
namespace {

HfSource same(std::string tensor, const Shape& shape) {
  return HfSource{std::move(tensor), shape, false, std::vector<int64_t>(shape.size(), 0), false};
}

// A Conv1D weight [in, out] whose columns [col, col + out) are the loom linear [out, in].
HfSource conv1d(std::string tensor, const Shape& loom, int64_t columns, int64_t col) {
  return HfSource{std::move(tensor), {loom[1], columns}, false, {0, col}, true};
}

// A layer parameter "h<digits>.<rest>" as its layer index text and the rest.
struct LayerName {
  std::string index;
  std::string rest;
};

std::optional<LayerName> layer_name(const std::string& name) {
  if (name.size() < 4 || name[0] != 'h') return std::nullopt;
  size_t i = 1;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
  if (i == 1 || i + 1 >= name.size() || name[i] != '.') return std::nullopt;
  return LayerName{name.substr(1, i - 1), name.substr(i + 1)};
}

// A GPT layer's parameter `rest` under the GPT-2 prefix `p` ("transformer.h.3.").
std::optional<HfSource> gpt_layer_source(const std::string& p, const std::string& rest,
                                         const Shape& shape) {
  if (rest == "ln1.w") return same(p + "ln_1.weight", shape);
  if (rest == "ln1.b") return same(p + "ln_1.bias", shape);
  if (rest == "ln2.w") return same(p + "ln_2.weight", shape);
  if (rest == "ln2.b") return same(p + "ln_2.bias", shape);
  // q, k and v are one Conv1D c_attn [hidden, 3 hidden] in transformers.
  static const std::vector<std::string> qkv = {"q", "k", "v"};
  for (size_t i = 0; i < qkv.size(); ++i) {
    const int64_t at = static_cast<int64_t>(i) * shape[0];
    if (rest == "attn." + qkv[i] + ".w" && shape.size() == 2)
      return conv1d(p + "attn.c_attn.weight", shape, 3 * shape[0], at);
    if (rest == "attn." + qkv[i] + ".b" && shape.size() == 1)
      return HfSource{p + "attn.c_attn.bias", {3 * shape[0]}, false, {at}, false};
  }
  const std::vector<std::pair<std::string, std::string>> linears = {
      {"attn.proj", "attn.c_proj"}, {"mlp.fc1", "mlp.c_fc"}, {"mlp.fc2", "mlp.c_proj"}};
  for (const auto& [loom, hf] : linears) {
    if (rest == loom + ".w" && shape.size() == 2)
      return conv1d(p + hf + ".weight", shape, shape[0], 0);
    if (rest == loom + ".b") return same(p + hf + ".bias", shape);
  }
  return std::nullopt;
}

Result<HfSource> gpt_source(const std::string& name, const Shape& shape) {
  if (name == "wte") return same("transformer.wte.weight", shape);
  if (name == "wpe") {
    HfSource s = same("transformer.wpe.weight", shape);
    s.more_rows = true;  // the run's seq may use fewer positions than n_positions
    return s;
  }
  if (name == "lnf.w") return same("transformer.ln_f.weight", shape);
  if (name == "lnf.b") return same("transformer.ln_f.bias", shape);
  if (name == "lm_head.w") return same("lm_head.weight", shape);
  if (const auto layer = layer_name(name))
    if (auto s = gpt_layer_source("transformer.h." + layer->index + ".", layer->rest, shape))
      return *s;
  return Error::at(name, "gpt parameter '" + name + "' has no Hugging Face (GPT-2) name");
}

Result<HfSource> llama_source(const std::string& name, const Shape& shape) {
  if (name == "embed.w") return same("model.embed_tokens.weight", shape);
  if (name == "norm.w") return same("model.norm.weight", shape);
  if (name == "lm_head.w") return same("lm_head.weight", shape);
  if (const auto layer = layer_name(name)) {
    const std::string p = "model.layers." + layer->index + ".";
    static const std::vector<std::pair<std::string, std::string>> names = {
        {"attn_norm.w", "input_layernorm.weight"},
        {"attn.q.w", "self_attn.q_proj.weight"},
        {"attn.k.w", "self_attn.k_proj.weight"},
        {"attn.v.w", "self_attn.v_proj.weight"},
        {"attn.o.w", "self_attn.o_proj.weight"},
        {"mlp_norm.w", "post_attention_layernorm.weight"},
        {"mlp.gate.w", "mlp.gate_proj.weight"},
        {"mlp.up.w", "mlp.up_proj.weight"},
        {"mlp.down.w", "mlp.down_proj.weight"},
    };
    for (const auto& [loom, hf] : names)
      if (layer->rest == loom) return same(p + hf, shape);
  }
  return Error::at(name, "llama parameter '" + name + "' has no Hugging Face name");
}

}  // namespace

HfNameMap gpt2_hf_names() {
  return {
      gpt_source, "transformer.", "transformer.wte.weight", {".attn.bias", ".attn.masked_bias"}};
}

HfNameMap llama_hf_names() {
  return {llama_source, "model.", "model.embed_tokens.weight", {"rotary_emb.inv_freq"}};
}

}  // namespace loom::models
