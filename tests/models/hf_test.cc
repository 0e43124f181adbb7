// Hugging Face name maps and config.json: which slice of which tensor each loom parameter is,
// model.args from a folder's config.json with mismatches named, and the config.json written
// back.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/durable_file.h"
#include "models/hf_config.h"
#include "models/hf_names.h"

namespace loom::models {
namespace {

namespace fs = std::filesystem;

TEST(HfNames, Gpt2FusedQkvIsTransposedColumns) {
  auto q = hf_source("gpt", "h3.attn.q.w", {32, 32});
  auto k = hf_source("gpt", "h3.attn.k.w", {32, 32});
  auto v = hf_source("gpt", "h3.attn.v.w", {32, 32});
  ASSERT_TRUE(q.ok() && k.ok() && v.ok());
  EXPECT_EQ(q->tensor, "transformer.h.3.attn.c_attn.weight");
  EXPECT_EQ(q->shape, (Shape{32, 96}));
  EXPECT_TRUE(q->transposed);
  // loom rows (output features) [8, 16) x input features [0, 32) of k: c_attn rows [0, 32),
  // columns 32 + [8, 16).
  EXPECT_EQ(k->region({{8, 16}, {0, 32}}), (Ranges{{0, 32}, {40, 48}}));
  EXPECT_EQ(v->region({{0, 32}, {4, 6}}), (Ranges{{4, 6}, {64, 96}}));
  auto kb = hf_source("gpt", "h3.attn.k.b", {32});
  ASSERT_TRUE(kb.ok());
  EXPECT_EQ(kb->tensor, "transformer.h.3.attn.c_attn.bias");
  EXPECT_EQ(kb->region({{0, 16}}), (Ranges{{32, 48}}));
}

TEST(HfNames, Gpt2Names) {
  const std::vector<std::pair<std::string, std::string>> names = {
      {"wte", "transformer.wte.weight"},
      {"wpe", "transformer.wpe.weight"},
      {"h0.ln1.w", "transformer.h.0.ln_1.weight"},
      {"h0.ln1.b", "transformer.h.0.ln_1.bias"},
      {"h11.ln2.w", "transformer.h.11.ln_2.weight"},
      {"h0.attn.proj.b", "transformer.h.0.attn.c_proj.bias"},
      {"h0.mlp.fc1.b", "transformer.h.0.mlp.c_fc.bias"},
      {"h0.mlp.fc2.b", "transformer.h.0.mlp.c_proj.bias"},
      {"lnf.w", "transformer.ln_f.weight"},
      {"lnf.b", "transformer.ln_f.bias"},
      {"lm_head.w", "lm_head.weight"}};
  for (const auto& [loom, hf] : names) {
    auto s = hf_source("gpt", loom, {8});
    ASSERT_TRUE(s.ok()) << loom;
    EXPECT_EQ(s->tensor, hf) << loom;
    EXPECT_FALSE(s->transposed) << loom;
  }
  EXPECT_TRUE(hf_source("gpt", "wpe", {16, 8})->more_rows);
  auto fc1 = hf_source("gpt", "h1.mlp.fc1.w", {128, 32});  // loom [out, in]
  ASSERT_TRUE(fc1.ok());
  EXPECT_EQ(fc1->tensor, "transformer.h.1.mlp.c_fc.weight");
  EXPECT_EQ(fc1->shape, (Shape{32, 128}));  // Conv1D [in, out]
  EXPECT_TRUE(fc1->transposed);
  auto fc2 = hf_source("gpt", "h1.mlp.fc2.w", {32, 128});
  EXPECT_EQ(fc2->tensor, "transformer.h.1.mlp.c_proj.weight");
  EXPECT_EQ(fc2->shape, (Shape{128, 32}));
  auto unknown = hf_source("gpt", "h1.mlp.fc3.w", {3, 3});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("h1.mlp.fc3.w"), std::string::npos);
}

TEST(HfNames, LlamaNamesAreUntransposed) {
  const std::vector<std::pair<std::string, std::string>> names = {
      {"embed.w", "model.embed_tokens.weight"},
      {"h2.attn_norm.w", "model.layers.2.input_layernorm.weight"},
      {"h2.attn.q.w", "model.layers.2.self_attn.q_proj.weight"},
      {"h2.attn.k.w", "model.layers.2.self_attn.k_proj.weight"},
      {"h2.attn.v.w", "model.layers.2.self_attn.v_proj.weight"},
      {"h2.attn.o.w", "model.layers.2.self_attn.o_proj.weight"},
      {"h2.mlp_norm.w", "model.layers.2.post_attention_layernorm.weight"},
      {"h2.mlp.gate.w", "model.layers.2.mlp.gate_proj.weight"},
      {"h2.mlp.up.w", "model.layers.2.mlp.up_proj.weight"},
      {"h2.mlp.down.w", "model.layers.2.mlp.down_proj.weight"},
      {"norm.w", "model.norm.weight"},
      {"lm_head.w", "lm_head.weight"}};
  for (const auto& [loom, hf] : names) {
    auto s = hf_source("llama", loom, {16, 8});
    ASSERT_TRUE(s.ok()) << loom;
    EXPECT_EQ(s->tensor, hf);
    EXPECT_EQ(s->shape, (Shape{16, 8}));
    EXPECT_FALSE(s->transposed);
    EXPECT_EQ(s->region({{4, 8}, {0, 8}}), (Ranges{{4, 8}, {0, 8}}));
  }
  EXPECT_FALSE(hf_source("swin", "x", {1}).ok());
}

TEST(HfNames, BuffersAndBasePrefix) {
  EXPECT_TRUE(hf_buffer("gpt", "h.0.attn.bias"));
  EXPECT_TRUE(hf_buffer("gpt", "transformer.h.3.attn.masked_bias"));
  EXPECT_FALSE(hf_buffer("gpt", "transformer.h.3.attn.c_attn.bias"));  // a weight
  EXPECT_TRUE(hf_buffer("llama", "model.layers.0.self_attn.rotary_emb.inv_freq"));
  EXPECT_FALSE(hf_buffer("llama", "model.layers.0.self_attn.q_proj.weight"));
  EXPECT_EQ(hf_base_prefix("gpt"), "transformer.");
  EXPECT_EQ(hf_base_prefix("llama"), "model.");
}

class FromHf : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("loom_from_hf_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  Result<Config> load(const std::string& json, const std::string& yaml) {
    EXPECT_TRUE(write_file_durably(dir_ / "config.json", json).ok());
    LOOM_ASSIGN_OR_RETURN(Config c,
                          parse_config(yaml + "\n  from_hf: " + dir_.string() + "\n", "test.yaml"));
    LOOM_TRY(apply_from_hf(c));
    return c;
  }
  fs::path dir_;
};

const char* kGpt2 = R"({"model_type": "gpt2", "n_layer": 3, "n_embd": 48, "n_head": 6,
  "vocab_size": 96, "n_positions": 40, "n_inner": null, "layer_norm_epsilon": 1e-05,
  "activation_function": "gelu", "tie_word_embeddings": true})";

TEST_F(FromHf, Gpt2FillsModelArgs) {
  auto c = load(kGpt2, "model:\n  type: gpt\n  args: {seq: 16}");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->model.args.at("layers"), "3");
  EXPECT_EQ(c->model.args.at("hidden"), "48");
  EXPECT_EQ(c->model.args.at("heads"), "6");
  EXPECT_EQ(c->model.args.at("vocab"), "96");
  EXPECT_EQ(c->model.args.at("ffn_hidden"), "192");  // n_inner null: 4 x n_embd
  EXPECT_EQ(c->model.args.at("ln_eps"), "1e-05");
  EXPECT_EQ(c->model.args.at("tied"), "true");
  EXPECT_EQ(c->model.args.at("activation"), "gelu");
  EXPECT_NE(c->where("model.args.hidden").find("n_embd"), std::string::npos);
}

TEST_F(FromHf, MismatchNamesBothKeysAndValues) {
  auto c = load(kGpt2, "model:\n  type: gpt\n  args: {seq: 16, hidden: 64}");
  ASSERT_FALSE(c.ok());
  const std::string& m = c.error().message;
  EXPECT_NE(m.find("model.args.hidden is 64"), std::string::npos) << m;
  EXPECT_NE(m.find("n_embd"), std::string::npos) << m;
  EXPECT_NE(m.find("48"), std::string::npos) << m;
  EXPECT_NE(m.find("test.yaml"), std::string::npos) << m;
  // The same value written differently agrees.
  EXPECT_TRUE(load(kGpt2, "model:\n  type: gpt\n  args: {seq: 16, ln_eps: 0.00001}").ok());
}

TEST_F(FromHf, SeqMustFitThePositions) {
  auto c = load(kGpt2, "model:\n  type: gpt\n  args: {seq: 64}");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("n_positions"), std::string::npos) << c.error().message;
  EXPECT_NE(c.error().message.find("model.args.seq"), std::string::npos);
}

TEST_F(FromHf, WrongModelTypeOrUnsupportedFeature) {
  auto c = load(kGpt2, "model:\n  type: llama\n  args: {seq: 16}");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("gpt2"), std::string::npos) << c.error().message;
  auto bias = load(R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32,
    "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 64,
    "max_position_embeddings": 64, "attention_bias": true})",
                   "model:\n  type: llama\n  args: {seq: 16}");
  ASSERT_FALSE(bias.ok());
  EXPECT_NE(bias.error().message.find("attention_bias"), std::string::npos);
  EXPECT_FALSE(load("[1, 2]", "model:\n  type: gpt").ok());
}

TEST_F(FromHf, LlamaRopeParametersAndScaling) {
  auto c = load(R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
    "vocab_size": 64, "max_position_embeddings": 64, "rms_norm_eps": 1e-05,
    "tie_word_embeddings": false, "rope_parameters": {"rope_type": "llama3",
    "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192}})",
                "model:\n  type: llama\n  args: {seq: 16}");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->model.args.at("kv_heads"), "2");
  EXPECT_EQ(c->model.args.at("ffn_hidden"), "64");
  EXPECT_EQ(c->model.args.at("norm_eps"), "1e-05");
  EXPECT_EQ(c->model.args.at("rope_theta"), "500000");
  EXPECT_EQ(c->model.args.at("tied"), "false");
  EXPECT_EQ(c->model.args.at("rope_factor"), "8");
  EXPECT_EQ(c->model.args.at("rope_high_freq_factor"), "4");
  EXPECT_EQ(c->model.args.at("rope_original_max_positions"), "8192");
  // transformers 4's top-level rope_theta.
  auto old = load(R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32,
    "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 64,
    "max_position_embeddings": 64, "rope_theta": 1234.5})",
                  "model:\n  type: llama\n  args: {seq: 16}");
  ASSERT_TRUE(old.ok()) << old.error().message;
  EXPECT_EQ(old->model.args.at("rope_theta"), "1234.5");
  EXPECT_EQ(old->model.args.at("kv_heads"), "4");
  EXPECT_EQ(old->model.args.at("rope_factor"), "0");  // no scaling, whatever the preset says
  // transformers 4's rope_scaling, as Llama 3.1's own config.json has it.
  auto scaled = load(R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32,
    "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 64,
    "max_position_embeddings": 64, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3",
    "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192}})",
                     "model:\n  type: llama\n  args: {seq: 16}");
  ASSERT_TRUE(scaled.ok()) << scaled.error().message;
  EXPECT_EQ(scaled->model.args.at("rope_factor"), "8");
  EXPECT_EQ(scaled->model.args.at("rope_theta"), "500000");
  // Heads wider than hidden / heads, and a scaling loom does not compute, are refused.
  auto head_dim = load(R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32,
    "num_attention_heads": 4, "head_dim": 16, "intermediate_size": 64, "vocab_size": 64,
    "max_position_embeddings": 64})",
                       "model:\n  type: llama\n  args: {seq: 16}");
  ASSERT_FALSE(head_dim.ok());
  EXPECT_NE(head_dim.error().message.find("head_dim"), std::string::npos);
  auto yarn = load(R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32,
    "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 64,
    "max_position_embeddings": 64, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4,
    "factor": 4.0}})",
                   "model:\n  type: llama\n  args: {seq: 16}");
  ASSERT_FALSE(yarn.ok());
  EXPECT_NE(yarn.error().message.find("yarn"), std::string::npos);
  EXPECT_NE(yarn.error().message.find("rope_parameters.rope_type"), std::string::npos);
}

TEST(HfConfigJson, Gpt2RoundTrip) {
  auto c = parse_config(
      "model:\n  type: gpt\n  args: {layers: 3, hidden: 48, heads: 6, vocab: "
      "96, seq: 16, tied: false, ln_eps: 1e-6}\n",
      "test.yaml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto text = hf_config_json(*c);
  ASSERT_TRUE(text.ok()) << text.error().message;
  auto j = nlohmann::json::parse(*text);
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["n_layer"], 3);
  EXPECT_EQ(j["n_embd"], 48);
  EXPECT_EQ(j["n_head"], 6);
  EXPECT_EQ(j["n_inner"], 192);
  EXPECT_EQ(j["n_positions"], 16);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(j["layer_norm_epsilon"], 1e-6);
  EXPECT_EQ(j["activation_function"], "gelu");
}

TEST(HfConfigJson, LlamaWithScaling) {
  auto c = parse_config(
      "model:\n  type: llama\n  args: {layers: 2, hidden: 32, heads: 4, kv_heads: "
      "2, ffn_hidden: 48, vocab: 64, seq: 16, norm_eps: 3e-5, rope_theta: 5000, "
      "rope_factor: 8}\n",
      "test.yaml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto text = hf_config_json(*c);
  ASSERT_TRUE(text.ok()) << text.error().message;
  auto j = nlohmann::json::parse(*text);
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["num_key_value_heads"], 2);
  EXPECT_EQ(j["intermediate_size"], 48);
  EXPECT_EQ(j["rms_norm_eps"], 3e-5);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(j["rope_parameters"]["rope_type"], "llama3");
  EXPECT_EQ(j["rope_parameters"]["rope_theta"], 5000.0);
  EXPECT_EQ(j["rope_parameters"]["factor"], 8.0);
  EXPECT_EQ(j["rope_parameters"]["original_max_position_embeddings"], 8192);
}

}  // namespace
}  // namespace loom::models
