#include <gtest/gtest.h>

#include "graph/verify.h"
#include "models/gpt.h"
#include "models/model.h"
#include "tests/support/plan_chain.h"

namespace loom::models {
namespace {

Config config_with(const std::vector<std::string>& overrides) {
  auto c = parse_config("model:\n  type: gpt\n  preset: tiny\n", "gpt.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

TEST(GptGraph, TinyHasTheExpectedStructure) {
  graph::OpRegistry r = graph::OpRegistry::with_builtin_ops();
  Config c = config_with({"batch.micro=2", "batch.global=2"});
  auto g = testing_support::single_device_graph(c, r);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE(graph::verify(*g, r).ok());
  int attention = 0, params = 0;
  for (const auto& op : g->ops()) attention += op.type() == "attention";
  for (const auto& t : g->tensors()) params += t.role == graph::TensorRole::kParameter;
  EXPECT_EQ(attention, 2);
  // wte, wpe, 2 x (2 norms x 2 + 6 linears x 2), final norm x 2; the head is tied.
  EXPECT_EQ(params, 2 + 2 * 16 + 2);
  EXPECT_EQ(g->tensor(*g->find_tensor("tokens")).shape, (Shape{2, 32}));
  int64_t total = 0;
  for (const auto& t : g->tensors())
    if (t.role == graph::TensorRole::kParameter) total += numel(t.shape);
  EXPECT_EQ(total, gpt_spec(c)->parameter_count());
}

TEST(GptGraph, PresetsHaveTheirPublishedSizes) {
  auto count = [](const std::string& preset) {
    return gpt_spec(config_with({"model.preset=" + preset}))->parameter_count();
  };
  EXPECT_NEAR(count("gpt2-124m") / 1e6, 124.5, 1.0);  // 50304-token vocabulary
  EXPECT_NEAR(count("gpt3-1.3b") / 1e9, 1.3, 0.1);
  EXPECT_NEAR(count("gpt3-175b") / 1e9, 175, 2.0);
}

TEST(GptGraph, LargestPresetIsMetadataOnly) {
  // The graph holds shapes, not tensors: 175 B parameters describe themselves in a few thousand
  // ops. (Build time is measured by bench/plan_scale, which builds it for every plan.)
  graph::OpRegistry r = graph::OpRegistry::with_builtin_ops();
  Config c = config_with({"model.preset=gpt3-175b", "batch.micro=1", "batch.global=1"});
  auto g = testing_support::single_device_graph(c, r);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_GT(g->ops().size(), 96u * 15);
  EXPECT_LT(g->ops().size(), 96u * 25);
  EXPECT_TRUE(graph::verify(*g, r).ok());
}

TEST(GptGraph, BadArgumentsNameTheKey) {
  graph::OpRegistry r = graph::OpRegistry::with_builtin_ops();
  auto heads = testing_support::single_device_graph(
      config_with({"model.args.hidden=64", "model.args.heads=5"}), r);
  ASSERT_FALSE(heads.ok());
  EXPECT_NE(
      heads.error().message.find("model.args.heads: hidden (64) is not divisible by heads (5)"),
      std::string::npos)
      << heads.error().message;
  auto zero = testing_support::single_device_graph(config_with({"model.args.layers=0"}), r);
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.error().message.find("model.args.layers: layers must be positive"),
            std::string::npos);
  auto preset = testing_support::single_device_graph(config_with({"model.preset=gpt3-175"}), r);
  ASSERT_FALSE(preset.ok());
  EXPECT_NE(preset.error().message.find("did you mean 'gpt3-175b'"), std::string::npos);
  auto type = testing_support::single_device_graph(config_with({"model.type=gtp"}), r);
  ASSERT_FALSE(type.ok());
  EXPECT_NE(type.error().message.find("did you mean 'gpt'"), std::string::npos);
  auto arg = testing_support::single_device_graph(config_with({"model.args.hiden=64"}), r);
  ASSERT_FALSE(arg.ok());
  EXPECT_NE(arg.error().message.find("did you mean 'model.args.hidden'"), std::string::npos);
}

// A vocabulary tensor parallelism cannot split (GPT-2's 50257) is padded to a multiple of 64 in
// 64 groups; the loss is told where the real vocabulary ends. One device keeps it as it is.
// Padded alike under every plan: a checkpoint saved under tp 2 holds the shape tp 1 builds.
TEST(GptGraph, OddVocabularyIsPaddedForTensorParallelism) {
  auto one = gpt_spec(config_with({"model.args.vocab=50257"}));
  ASSERT_TRUE(one.ok()) << one.error().message;
  EXPECT_EQ(one->vocab_rows, 50304);
  auto even = gpt_spec(config_with({"model.args.vocab=50304"}));
  ASSERT_TRUE(even.ok()) << even.error().message;
  EXPECT_EQ(even->vocab_rows, 50304);
  auto tp2 = gpt_spec(config_with({"model.args.vocab=50257", "parallel.tp=2"}));
  ASSERT_TRUE(tp2.ok()) << tp2.error().message;
  EXPECT_EQ(tp2->vocab, 50257);
  EXPECT_EQ(tp2->vocab_rows, 50304);
  EXPECT_EQ(tp2->vocab_groups, 64);
  graph::OpRegistry r = graph::OpRegistry::with_builtin_ops();
  auto g = build_gpt(*tp2, 1, r);
  ASSERT_TRUE(g.ok()) << g.error().message;
  for (const graph::FullTensor& t : g->tensors()) {
    if (t.name == "wte") {
      EXPECT_EQ(t.shape, (Shape{50304, tp2->hidden}));
    }
  }
  int valid = 0;
  for (const graph::Op& op : g->ops())
    if (op.attrs().get_or<int64_t>("valid", 0) == 50257) ++valid;
  EXPECT_EQ(valid, 2);  // group_logsumexp and nll
  // An explicit vocab_groups is the user's: not padded, refused as before.
  auto given = gpt_spec(
      config_with({"model.args.vocab=50257", "model.args.vocab_groups=1", "parallel.tp=2"}));
  ASSERT_TRUE(given.ok());
  EXPECT_EQ(given->vocab_rows, 50257);
}

}  // namespace
}  // namespace loom::models
