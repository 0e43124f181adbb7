// lower::fused_losses: the vocabulary-group loss chain runs as one cross-entropy where a rank
// holds the whole vocabulary of its tokens (one device, dp, pp, sp), never where tensor
// parallelism splits the vocabulary.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "lower/fusion.h"
#include "plan/plan.h"

namespace loom::plan {
namespace {

Result<Plan> plan_of(const std::string& model, const std::vector<std::string>& overrides) {
  const std::string yaml = "model: {type: " + model +
                           ", preset: tiny}\n"
                           "batch: {global: 8, micro: 2}\n"
                           "optimizer: {type: sgd, lr: 0.05}\n";
  auto c = parse_config(yaml, "loss_fusion_test.yaml", overrides);
  if (!c.ok()) return c.error();
  return make_plan(*c);
}

// The ranks whose programs hold a fused chain, after checking each chain is one loss chain on
// one rank, its four ops consecutive in a segment, reading the whole vocabulary.
std::set<int64_t> fused_ranks(const Plan& plan) {
  const graph::Graph& g = plan.file.graph;
  std::set<int64_t> ranks;
  for (const lower::FusedLoss& c : lower::fused_losses(g, plan.file.lowered)) {
    auto op = [&](int64_t i) -> const graph::Op& { return g.ops()[static_cast<size_t>(i)]; };
    EXPECT_EQ(op(c.group_lse).type(), "group_logsumexp");
    EXPECT_EQ(op(c.lse).type(), "logsumexp");
    EXPECT_EQ(op(c.pick).type(), "pick");
    EXPECT_EQ(op(c.nll).type(), "nll");
    const DeviceId d = op(c.nll).device;
    for (int64_t i : {c.group_lse, c.lse, c.pick}) EXPECT_EQ(op(i).device, d);
    const graph::SubTensor& logits = op(c.group_lse).inputs[0];
    EXPECT_FALSE(logits.is_partial());
    EXPECT_EQ(logits.ranges.back().end - logits.ranges.back().start,
              g.tensor(logits.tensor).shape.back());
    bool consecutive = false;
    for (const auto& seg : plan.file.lowered.programs[static_cast<size_t>(d.value())].segments)
      for (size_t k = 0; k < seg.items.size(); ++k)
        if (seg.items[k].index == c.first && seg.items[k].kind == lower::SegmentItem::Kind::kOp) {
          std::set<int64_t> four;
          for (size_t j = k; j < k + 4 && j < seg.items.size(); ++j)
            four.insert(seg.items[j].index);
          consecutive = four == std::set<int64_t>{c.group_lse, c.lse, c.pick, c.nll};
        }
    EXPECT_TRUE(consecutive) << "rank " << d.value();
    EXPECT_TRUE(ranks.insert(d.value()).second) << "two chains on rank " << d.value();
  }
  return ranks;
}

TEST(LossFusion, FusedWhereTheRankHoldsTheWholeVocabulary) {
  struct Case {
    std::string model;
    std::vector<std::string> overrides;
    std::set<int64_t> ranks;  // the ranks that run a fused loss
  };
  const std::vector<Case> cases = {
      {"gpt", {}, {0}},
      {"gpt", {"parallel.dp=2"}, {0, 1}},
      {"gpt", {"parallel.pp=2"}, {1}},                      // the loss on the last stage
      {"gpt", {"parallel.dp=2", "parallel.pp=2"}, {2, 3}},  // stage 1 on ranks 2, 3
      {"llama", {}, {0}},
      {"llama", {"parallel.dp=2"}, {0, 1}},
  };
  for (const Case& c : cases) {
    auto plan = plan_of(c.model, c.overrides);
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    EXPECT_EQ(fused_ranks(*plan), c.ranks)
        << c.model << " " << ::testing::PrintToString(c.overrides);
  }
}

TEST(LossFusion, NotFusedUnderATensorParallelVocabularySplit) {
  for (const char* model : {"gpt", "llama"})
    for (const std::vector<std::string>& overrides :
         std::vector<std::vector<std::string>>{{"parallel.tp=2"},
                                               {"parallel.dp=2", "parallel.tp=2"},
                                               {"parallel.tp=2", "parallel.pp=2"}}) {
      auto plan = plan_of(model, overrides);
      ASSERT_TRUE(plan.ok()) << plan.error().message;
      const graph::Graph& g = plan->file.graph;
      // The premise: tp splits the logits' vocabulary on every rank that computes the loss.
      int64_t split = 0;
      for (const graph::Op& op : g.ops())
        if (op.type() == "group_logsumexp") {
          const graph::SubTensor& logits = op.inputs[0];
          split += logits.ranges.back().end - logits.ranges.back().start <
                   g.tensor(logits.tensor).shape.back();
        }
      EXPECT_GT(split, 0) << model;
      EXPECT_TRUE(fused_ranks(*plan).empty())
          << model << " " << ::testing::PrintToString(overrides);
    }
}

}  // namespace
}  // namespace loom::plan
