// Hugging Face config.json: model.args from a folder's config.json with mismatches named, and
// the config.json written back.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/durable_file.h"
#include "models/hf_config.h"

namespace loom::models {
namespace {

namespace fs = std::filesystem;

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

const char* kLlama = R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32,
  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48, "vocab_size": 64,
  "max_position_embeddings": 64, "rms_norm_eps": 1e-06, "rope_theta": 5000.0,
  "tie_word_embeddings": false})";

// checkpoint.init_from without model.from_hf: the run's model (preset and model.args) must be the
// folder's, else its weights train a model transformers would not compute.
TEST_F(FromHf, InitFromDisagreeingWithTheRunIsRefused) {
  ASSERT_TRUE(write_file_durably(dir_ / "config.json", kLlama).ok());
  auto run = [&](const std::string& args) -> Result<Config> {
    LOOM_ASSIGN_OR_RETURN(
        Config c, parse_config("model:\n  type: llama\n  args: {layers: 2, hidden: 32, heads: 4, "
                               "kv_heads: 2, ffn_hidden: 48, vocab: 64" +
                                   args + "}\ncheckpoint:\n  init_from: " + dir_.string() + "\n",
                               "test.yaml"));
    LOOM_TRY(apply_from_hf(c));
    return c;
  };
  auto eps = run(", seq: 16");  // the preset's norm_eps 1e-5 and rope_theta 10000
  ASSERT_FALSE(eps.ok());
  for (const std::string& want : std::vector<std::string>{
           "checkpoint.init_from", (dir_ / "config.json").string(), "rms_norm_eps 1e-06",
           "model.args.norm_eps is 1e-05", "model.from_hf", "test.yaml"})
    EXPECT_NE(eps.error().message.find(want), std::string::npos)
        << want << " in " << eps.error().message;
  auto theta = run(", seq: 16, norm_eps: 1e-6");
  ASSERT_FALSE(theta.ok());
  EXPECT_NE(theta.error().message.find("rope_theta 5000"), std::string::npos)
      << theta.error().message;
  EXPECT_NE(theta.error().message.find("model.args.rope_theta is 10000"), std::string::npos)
      << theta.error().message;
  auto tied = run(", seq: 16, norm_eps: 1e-6, rope_theta: 5000, tied: true");
  ASSERT_FALSE(tied.ok());
  EXPECT_NE(tied.error().message.find("tie_word_embeddings false"), std::string::npos)
      << tied.error().message;
  EXPECT_TRUE(run(", seq: 16, norm_eps: 1e-6, rope_theta: 5000").ok());
  auto seq = run(", norm_eps: 1e-6, rope_theta: 5000, seq: 128");
  ASSERT_FALSE(seq.ok());
  EXPECT_NE(seq.error().message.find("max_position_embeddings"), std::string::npos)
      << seq.error().message;
  // model.from_hf naming the same folder fills model.args from it: nothing to disagree.
  EXPECT_TRUE(load(kLlama, "checkpoint:\n  init_from: " + dir_.string() +
                               "\nmodel:\n  type: llama\n  args: {seq: 16}")
                  .ok());
}

// A folder that says tied may be untied explicitly (transformers unties one holding its own
// lm_head.weight); the opposite, a tied run of an untied folder, is a disagreement.
TEST_F(FromHf, ModelArgsMayUntieATiedFolder) {
  auto untied = load(kGpt2, "model:\n  type: gpt\n  args: {seq: 16, tied: false}");
  ASSERT_TRUE(untied.ok()) << untied.error().message;
  EXPECT_EQ(untied->model.args.at("tied"), "false");
  auto tied = load(kLlama, "model:\n  type: llama\n  args: {seq: 16, tied: true}");
  ASSERT_FALSE(tied.ok());
  EXPECT_NE(tied.error().message.find("tie_word_embeddings"), std::string::npos);
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
