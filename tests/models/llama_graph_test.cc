#include <gtest/gtest.h>

#include "graph/verify.h"
#include "models/llama.h"
#include "models/model.h"
#include "tests/support/plan_chain.h"

namespace loom::models {
namespace {

Config config_with(const std::vector<std::string>& overrides) {
  auto c = parse_config("model:\n  type: llama\n  preset: tiny\n", "llama.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

int64_t graph_parameters(const graph::Graph& g) {
  int64_t total = 0;
  for (const auto& t : g.tensors())
    if (t.role == graph::TensorRole::kParameter) total += numel(t.shape);
  return total;
}

int count_ops(const graph::Graph& g, const std::string& type) {
  int n = 0;
  for (const auto& op : g.ops()) n += op.type() == type;
  return n;
}

TEST(LlamaGraph, TinyHasTheExpectedStructure) {
  graph::OpRegistry r = graph::OpRegistry::with_builtin_ops();
  Config c = config_with({"batch.micro=2", "batch.global=2"});
  auto g = testing_support::single_device_graph(c, r);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE(graph::verify(*g, r).ok());
  EXPECT_EQ(count_ops(*g, "gqa_attention"), 2);
  EXPECT_EQ(count_ops(*g, "rope"), 4);  // queries and keys of each layer
  EXPECT_EQ(count_ops(*g, "rms_norm"), 5);
  EXPECT_EQ(count_ops(*g, "bias_add"), 0);
  // Query heads of 16 and 2 kv heads: k and v project to 32 features.
  EXPECT_EQ(g->tensor(*g->find_tensor("h0.attn.k.w")).shape, (Shape{32, 64}));
  EXPECT_EQ(g->tensor(*g->find_tensor("h0.attn.q.w")).shape, (Shape{64, 64}));
  EXPECT_EQ(g->tensor(*g->find_tensor("h0.mlp.gate.w")).shape, (Shape{160, 64}));
  EXPECT_TRUE(g->find_tensor("lm_head.w").has_value());  // untied by default
  EXPECT_EQ(graph_parameters(*g), llama_spec(c)->parameter_count());
  auto tied = testing_support::single_device_graph(config_with({"model.args.tied=true"}), r);
  ASSERT_TRUE(tied.ok());
  EXPECT_FALSE(tied->find_tensor("lm_head.w").has_value());
  EXPECT_EQ(graph_parameters(*tied),
            llama_spec(config_with({"model.args.tied=true"}))->parameter_count());
}

// More tensor-parallel ranks than kv heads: the kv projections stay whole (replicated) and each
// rank's attention reads the kv heads of its query heads.
TEST(LlamaGraph, TensorParallelBeyondTheKvHeadsSharesThem) {
  graph::OpRegistry r = graph::OpRegistry::with_builtin_ops();
  auto g = testing_support::single_device_graph(config_with({"parallel.tp=4"}), r);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(count_ops(*g, "gqa_attention"), 0);
  EXPECT_EQ(count_ops(*g, "shared_kv_attention"), 2);
  int replicated = 0;  // the k and v projections of both layers carry no tp hint
  for (const auto& op : g->ops()) {
    const bool kv = op.name().find(".attn.k") != std::string::npos ||
                    op.name().find(".attn.v") != std::string::npos;
    if (kv && op.type() == "linear") {
      EXPECT_EQ(op.attrs().get_or<std::string>("tp", "?"), "") << op.name();
      ++replicated;
    }
  }
  EXPECT_EQ(replicated, 4);
  EXPECT_TRUE(testing_support::check_split(config_with({"parallel.tp=4"})).ok());
}

TEST(LlamaGraph, PresetsHaveTheirPublishedSizes) {
  auto count = [](const std::string& preset) {
    return llama_spec(config_with({"model.preset=" + preset}))->parameter_count();
  };
  // Meta's model cards: 8.03 B, 70.6 B and 405.9 B parameters (untied, vocabulary 128256).
  EXPECT_NEAR(count("llama3-8b") / 1e9, 8.03, 0.01);
  EXPECT_NEAR(count("llama3-70b") / 1e9, 70.55, 0.05);
  EXPECT_NEAR(count("llama3.1-405b") / 1e9, 405.85, 0.1);
  EXPECT_EQ(llama_spec(config_with({"model.preset=llama3.1-405b"}))->rope_factor, 8.0);
  EXPECT_EQ(llama_spec(config_with({"model.preset=llama3-70b"}))->rope_factor, 0.0);
}

TEST(LlamaGraph, ErrorsNameTheKeyAndTheNumbers) {
  auto error_of = [](const std::vector<std::string>& overrides) {
    Config c = config_with(overrides);
    auto spec = llama_spec(c);
    if (!spec.ok()) return spec.error().message;
    Status s = testing_support::check_split(c);
    return s.ok() ? std::string() : s.error().message;
  };
  EXPECT_NE(error_of({"model.args.kv_heads=3"}).find("model.args.kv_heads"), std::string::npos);
  EXPECT_NE(error_of({"model.args.kv_heads=3"}).find("heads (4) is not divisible by kv_heads (3)"),
            std::string::npos);
  // 4 query heads in 4 kv heads under tp 8: heads are not divisible.
  EXPECT_NE(error_of({"parallel.tp=8"}).find("heads (4)"), std::string::npos);
  // 8 query heads over 4 kv heads under tp 8: each kv head is repeated on 2 ranks. 3 kv heads
  // under tp 2 can be neither split nor repeated.
  EXPECT_EQ(error_of({"model.args.heads=8", "model.args.kv_heads=4", "parallel.tp=8",
                      "model.args.ffn_hidden=64"}),
            "");
  const std::string odd = error_of(
      {"model.args.heads=12", "model.args.kv_heads=3", "model.args.hidden=96", "parallel.tp=2"});
  EXPECT_NE(odd.find("kv_heads (3)"), std::string::npos) << odd;
  EXPECT_NE(error_of({"model.preset=llama4"}).find("unknown Llama preset 'llama4'"),
            std::string::npos);
  EXPECT_NE(error_of({"model.args.rope_thetta=5"}).find("rope_theta"), std::string::npos);
}

TEST(LlamaGraph, PaperScalePresetsPlanWithoutTensors) {
  graph::OpRegistry r = graph::OpRegistry::with_builtin_ops();
  auto c = config_with({"model.preset=llama3.1-405b", "batch.micro=1", "batch.global=1"});
  auto g = testing_support::single_device_graph(c, r);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(graph_parameters(*g), llama_spec(c)->parameter_count());
}

}  // namespace
}  // namespace loom::models

namespace loom::models {
namespace {

// A mixture of experts: every layer of tiny-moe routes to 4 experts whose weights carry the
// expert dimension; the graph's parameters are the spec's count; Mixtral 8x7B has its published
// 46.7 B parameters.
TEST(LlamaMoeGraph, ExpertsReplaceTheMlp) {
  graph::OpRegistry r = graph::OpRegistry::with_builtin_ops();
  Config c = config_with({"model.preset=tiny-moe", "model.args.moe.shared_experts=1"});
  auto g = testing_support::single_device_graph(c, r);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE(graph::verify(*g, r).ok());
  EXPECT_EQ(count_ops(*g, "moe_dispatch"), 2);
  EXPECT_EQ(count_ops(*g, "moe_aux_loss"), 2);
  EXPECT_EQ(count_ops(*g, "expert_linear"), 6);
  EXPECT_EQ(g->tensor(*g->find_tensor("h0.moe.experts.gate.w")).shape, (Shape{4, 96, 64}));
  EXPECT_EQ(g->tensor(*g->find_tensor("h0.moe.router.w")).shape, (Shape{4, 64}));
  EXPECT_EQ(g->tensor(*g->find_tensor("h0.moe.shared.up.w")).shape, (Shape{96, 64}));
  EXPECT_FALSE(g->find_tensor("h0.mlp.gate.w").has_value());
  EXPECT_EQ(graph_parameters(*g), llama_spec(c)->parameter_count());
  // The loss adds the layers' load-balancing losses.
  EXPECT_EQ(g->tensor(g->loss()).name, "loss.total");
  const auto mixtral = llama_spec(config_with({"model.preset=mixtral-8x7b"}));
  ASSERT_TRUE(mixtral.ok());
  EXPECT_NEAR(mixtral->parameter_count() / 1e9, 46.70, 0.01);
}

TEST(LlamaMoeGraph, BadExpertArgumentsNameTheKey) {
  auto error_of = [](const std::vector<std::string>& overrides) {
    Config c = config_with(overrides);
    auto spec = llama_spec(c);
    if (!spec.ok()) return spec.error().message;
    Status s = testing_support::check_split(c);
    return s.ok() ? std::string() : s.error().message;
  };
  EXPECT_NE(
      error_of({"model.preset=tiny-moe", "model.args.moe.top_k=5"}).find("model.args.moe.top_k"),
      std::string::npos);
  EXPECT_NE(
      error_of({"model.preset=tiny-moe", "model.args.moe.score=relu"}).find("model.args.moe.score"),
      std::string::npos);
  EXPECT_NE(error_of({"model.preset=tiny-moe", "model.args.moe.expert=4"}).find("moe.experts"),
            std::string::npos);  // did you mean
  // ep must divide the experts, and needs experts at all.
  EXPECT_NE(error_of({"model.preset=tiny-moe", "parallel.dp=8", "parallel.ep=8", "batch.micro=1"})
                .find("parallel.ep"),
            std::string::npos);
  EXPECT_NE(error_of({"parallel.dp=2", "parallel.ep=2", "batch.micro=1"})
                .find("needs a mixture of experts"),
            std::string::npos);
  EXPECT_EQ(error_of({"model.preset=tiny-moe", "parallel.dp=4", "parallel.ep=4", "batch.micro=1"}),
            "");
}

}  // namespace
}  // namespace loom::models
