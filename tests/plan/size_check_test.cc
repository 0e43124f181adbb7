// Size checks before building (plan/size_check.h): a model or world that cannot fit is refused
// by its numbers, naming the key, before a graph of that size exists.
#include "plan/size_check.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/durable_file.h"
#include "models/hf_config.h"
#include "plan/plan.h"

namespace loom::plan {
namespace {

namespace fs = std::filesystem;

Config config(const std::vector<std::string>& overrides) {
  auto c = parse_config(
      "model: {type: gpt, preset: tiny}\nbatch: {global: 8, micro: 2}\n"
      "optimizer: {type: adamw, lr: 0.01}\n",
      "size.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

void expect_refused(const Result<Plan>& plan, const std::string& key, const std::string& says) {
  ASSERT_FALSE(plan.ok()) << "planned: " << key;
  EXPECT_EQ(plan.error().key, key) << plan.error().message;
  EXPECT_NE(plan.error().message.find(says), std::string::npos) << plan.error().message;
}

// 100 million layers of GPT tiny (4.9e12 parameters) were built for half a minute and 4.5 GB
// before any refusal; the weights alone are 40 TB, more than any one device.
TEST(SizeCheck, AModelTooLargeForItsRanksIsRefusedBeforeItIsBuilt) {
  expect_refused(make_plan(config({"model.args.layers=100000000"})), "model.args.layers",
                 "the model (layers 100000000, hidden 64, ffn_hidden 256, vocab 256) has "
                 "4.92e+12 parameters at least");
}

// The boundary is the arithmetic: AdamW in float32 holds 16 bytes per parameter (weights,
// gradients, two moments), so a device of exactly that many bytes fits the model and one byte
// less per parameter does not.
TEST(SizeCheck, TheBoundIsSixteenBytesPerParameterUnderAdamw) {
  const Config c = config({"model.args.layers=1000"});
  const models::ModelRegistry zoo = models::ModelRegistry::with_builtin_models();
  auto type = zoo.of(c);
  ASSERT_TRUE(type.ok());
  auto size = (*type)->size(c);
  ASSERT_TRUE(size.ok()) << size.error().message;
  auto spec = PlanSpec::of(c);
  ASSERT_TRUE(spec.ok());
  CostModel cost = CostModel::builtin();
  cost.device_memory_bytes = size->parameters * 16;
  EXPECT_TRUE(check_model_fits(c, *spec, **type, cost, 1).ok());
  cost.device_memory_bytes = size->parameters * 15;
  EXPECT_FALSE(check_model_fits(c, *spec, **type, cost, 1).ok());
  EXPECT_TRUE(check_model_fits(c, *spec, **type, cost, 2).ok());  // two ranks hold it
}

// A Hugging Face folder's num_hidden_layers reaches the same check as model.args.layers.
TEST(SizeCheck, AFolderWithAHundredMillionLayersIsRefused) {
  const fs::path dir = fs::path(testing::TempDir()) / "loom_size_check_hf";
  fs::create_directories(dir);
  ASSERT_TRUE(write_file_durably(dir / "config.json",
                                 R"({"model_type": "llama", "num_hidden_layers": 100000000,
  "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
  "intermediate_size": 160, "vocab_size": 256, "max_position_embeddings": 32,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false})")
                  .ok());
  auto c = parse_config(
      "model: {type: llama, from_hf: " + dir.string() + "}\nbatch: {global: 8, micro: 2}\n",
      "hf.yaml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_TRUE(models::apply_from_hf(*c).ok());
  expect_refused(make_plan(*c), "model.args.layers", "the model (layers 100000000, hidden 64");
}

// A million data-parallel ranks of GPT tiny hold about 93 million sub-operators while planned
// (tens of GB); a hundred million are beyond any machine: refused before the policy runs.
TEST(SizeCheck, AWorldTooLargeToPlanHereIsRefusedBeforePlanning) {
  expect_refused(make_plan(config({"parallel.dp=100000000", "batch.global=200000000"})),
                 "world_size", "a plan of 100000000 ranks holds about");
}

}  // namespace
}  // namespace loom::plan
