// Hugging Face name maps: which slice of which Hugging Face tensor each loom parameter is.
#include "models/hf_names.h"

#include <gtest/gtest.h>

#include "models/model.h"

namespace loom::models {
namespace {

TEST(HfNames, Gpt2FusedQkvIsTransposedColumns) {
  auto q = gpt2_hf_names().source("h3.attn.q.w", {32, 32});
  auto k = gpt2_hf_names().source("h3.attn.k.w", {32, 32});
  auto v = gpt2_hf_names().source("h3.attn.v.w", {32, 32});
  ASSERT_TRUE(q.ok() && k.ok() && v.ok());
  EXPECT_EQ(q->tensor, "transformer.h.3.attn.c_attn.weight");
  EXPECT_EQ(q->shape, (Shape{32, 96}));
  EXPECT_TRUE(q->transposed);
  // loom rows (output features) [8, 16) x input features [0, 32) of k: c_attn rows [0, 32),
  // columns 32 + [8, 16).
  EXPECT_EQ(k->region({{8, 16}, {0, 32}}), (SliceRanges{{0, 32}, {40, 48}}));
  EXPECT_EQ(v->region({{0, 32}, {4, 6}}), (SliceRanges{{4, 6}, {64, 96}}));
  auto kb = gpt2_hf_names().source("h3.attn.k.b", {32});
  ASSERT_TRUE(kb.ok());
  EXPECT_EQ(kb->tensor, "transformer.h.3.attn.c_attn.bias");
  EXPECT_EQ(kb->region({{0, 16}}), (SliceRanges{{32, 48}}));
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
    auto s = gpt2_hf_names().source(loom, {8});
    ASSERT_TRUE(s.ok()) << loom;
    EXPECT_EQ(s->tensor, hf) << loom;
    EXPECT_FALSE(s->transposed) << loom;
  }
  EXPECT_TRUE(gpt2_hf_names().source("wpe", {16, 8})->more_rows);
  // A vocabulary padded for tensor parallelism: the file holds the real rows alone.
  auto padded = gpt2_hf_names().source("wte", {64, 8}, /*vocab=*/63);
  ASSERT_TRUE(padded.ok());
  EXPECT_TRUE(padded->padded_rows);
  EXPECT_EQ(padded->shape, (Shape{63, 8}));
  EXPECT_FALSE(gpt2_hf_names().source("wte", {63, 8}, 63)->padded_rows);
  EXPECT_TRUE(llama_hf_names().source("lm_head.w", {64, 8}, 50)->padded_rows);
  auto fc1 = gpt2_hf_names().source("h1.mlp.fc1.w", {128, 32});  // loom [out, in]
  ASSERT_TRUE(fc1.ok());
  EXPECT_EQ(fc1->tensor, "transformer.h.1.mlp.c_fc.weight");
  EXPECT_EQ(fc1->shape, (Shape{32, 128}));  // Conv1D [in, out]
  EXPECT_TRUE(fc1->transposed);
  auto fc2 = gpt2_hf_names().source("h1.mlp.fc2.w", {32, 128});
  EXPECT_EQ(fc2->tensor, "transformer.h.1.mlp.c_proj.weight");
  EXPECT_EQ(fc2->shape, (Shape{128, 32}));
  auto unknown = gpt2_hf_names().source("h1.mlp.fc3.w", {3, 3});
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
    auto s = llama_hf_names().source(loom, {16, 8});
    ASSERT_TRUE(s.ok()) << loom;
    EXPECT_EQ(s->tensor, hf);
    EXPECT_EQ(s->shape, (Shape{16, 8}));
    EXPECT_FALSE(s->transposed);
    EXPECT_EQ(s->region({{4, 8}, {0, 8}}), (SliceRanges{{4, 8}, {0, 8}}));
  }
  EXPECT_FALSE(llama_hf_names().source("x", {1}).ok());
  EXPECT_FALSE(HfNameMap{}.source("embed.w", {1}).ok());  // a type without a map
}

TEST(HfNames, BuffersAndBasePrefix) {
  EXPECT_TRUE(gpt2_hf_names().buffer("h.0.attn.bias"));
  EXPECT_TRUE(gpt2_hf_names().buffer("transformer.h.3.attn.masked_bias"));
  EXPECT_FALSE(gpt2_hf_names().buffer("transformer.h.3.attn.c_attn.bias"));  // a weight
  EXPECT_TRUE(llama_hf_names().buffer("model.layers.0.self_attn.rotary_emb.inv_freq"));
  EXPECT_FALSE(llama_hf_names().buffer("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_EQ(gpt2_hf_names().base_prefix, "transformer.");
  EXPECT_EQ(llama_hf_names().base_prefix, "model.");
  // The registry gives each type its map, and none to a type without one.
  const ModelRegistry zoo = ModelRegistry::with_builtin_models();
  EXPECT_EQ(zoo.find("gpt")->hf_names.embedding, "transformer.wte.weight");
  EXPECT_EQ(zoo.find("llama")->hf_names.embedding, "model.embed_tokens.weight");
  EXPECT_TRUE(zoo.find("swin")->hf_names.empty());
}

}  // namespace
}  // namespace loom::models
