// Context parallelism's causal load balance, without LibTorch: in zigzag order every cp rank
// computes the same ring-attention blocks at every step, and the estimate's per-rank compute is
// equal; in contiguous order rank c computes c + 1 chunks of keys, which the estimate shows.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "graph/ops_context.h"
#include "models/model.h"
#include "plan/estimate.h"
#include "plan/plan.h"
#include "planner/context_parallel.h"
#include "tests/support/plan_chain.h"

namespace loom::plan {
namespace {

Config config(const std::string& order, int64_t cp, int64_t seq) {
  auto c = parse_config(
      "model: {type: llama, preset: tiny}\nbatch: {global: 2, micro: 2}\n"
      "optimizer: {type: sgd, lr: 0.05}\n",
      "cp.yaml",
      {"parallel.cp=" + std::to_string(cp),
       order == "zigzag" ? "parallel.cp_kind=p2p" : "parallel.cp_kind=p2p-contiguous",
       "model.args.seq=" + std::to_string(seq), "cost.preset=h100"});
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

// The (query, key) score pairs each cp rank computes at each ring step of layer 0's attention:
// [step][rank].
std::vector<std::vector<int64_t>> pairs_per_step_and_rank(const Config& c) {
  const auto ops = graph::OpRegistry::with_builtin_ops();
  auto g = testing_support::single_device_graph(c, ops);
  EXPECT_TRUE(g.ok()) << g.error().message;
  std::vector<std::vector<int64_t>> out;
  if (!g.ok()) return out;
  for (const graph::Op& op : g->ops()) {
    if (op.type() != graph::kRingAttentionStep || op.layer() != 0) continue;
    std::vector<int64_t> ranks;
    for (const graph::Op& part : planner::ring_step_parts(op)) {
      int64_t pairs = 0;
      for (const graph::AttentionBlock& b : graph::ring_step_blocks(part))
        pairs += b.q.len * b.k.len;
      ranks.push_back(pairs);
    }
    out.push_back(ranks);
  }
  return out;
}

TEST(ContextParallelBalance, ZigzagGivesEveryRankTheSameBlocksAtEveryStep) {
  // seq 64 over cp 4: halves of h = 8 positions. Zigzag: step 0 two diagonal blocks and one
  // full one (3 h^2 computed), every other step two full blocks (2 h^2).
  const auto zigzag = pairs_per_step_and_rank(config("zigzag", 4, 64));
  ASSERT_EQ(zigzag.size(), 4u);
  for (size_t k = 0; k < zigzag.size(); ++k)
    for (int64_t pairs : zigzag[k]) EXPECT_EQ(pairs, (k == 0 ? 3 : 2) * 64) << "step " << k;
  // Contiguous: chunks of 16; at step k the ranks before k see nothing, the others a whole
  // chunk (step 0: the diagonal chunk, computed whole).
  const auto contiguous = pairs_per_step_and_rank(config("contiguous", 4, 64));
  ASSERT_EQ(contiguous.size(), 4u);
  for (size_t k = 0; k < contiguous.size(); ++k)
    for (size_t c = 0; c < contiguous[k].size(); ++c)
      EXPECT_EQ(contiguous[k][c], c < k ? 0 : 256) << "step " << k << " rank " << c;
}

// The estimate's compute per rank: the slowest rank's, and the spread over the ranks
// ((slowest - fastest) / slowest).
std::pair<double, double> slowest_and_spread(const Config& c) {
  auto plan = make_plan(c);
  EXPECT_TRUE(plan.ok()) << plan.error().message;
  if (!plan.ok()) return {-1, -1};
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (const RankEstimate& r : plan->estimate.ranks) {
    lo = std::min(lo, r.compute_s);
    hi = std::max(hi, r.compute_s);
  }
  return {hi, (hi - lo) / hi};
}

TEST(ContextParallelBalance, TheEstimateComputesAsMuchOnEveryRankInZigzagOrder) {
  // Llama tiny at 1024 positions over cp 4 on H100s (one device each, where CPU ranks would
  // share a node's cores and its work): attention is most of a rank's FLOPs, so contiguous
  // order's last rank, computing all its keys, sets the step; zigzag's ranks compute the same,
  // and the step is shorter.
  const auto [zigzag_s, zigzag_spread] = slowest_and_spread(config("zigzag", 4, 1024));
  const auto [contiguous_s, contiguous_spread] = slowest_and_spread(config("contiguous", 4, 1024));
  EXPECT_LT(zigzag_spread, 1e-9);
  // Every rank of a stage reports the stage's time (the schedule's), which contiguous order's
  // busiest rank sets.
  EXPECT_LT(contiguous_spread, 1e-9);
  EXPECT_LT(zigzag_s, 0.9 * contiguous_s);
}

TEST(ContextParallelBalance, ZigzagNeedsTwoHalvesPerRankAndNoCapacity) {
  const auto ops = graph::OpRegistry::with_builtin_ops();
  Config odd = config("zigzag", 4, 36);  // 36 splits into 4 chunks, not 8 halves
  Status s = testing_support::check_split(odd);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("parallel.cp"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("not divisible by 8"), std::string::npos) << s.error().message;
  EXPECT_TRUE(testing_support::single_device_graph(config("contiguous", 4, 36), ops).ok());
  // All-to-all keeps the sequence in order: cp chunks are enough (seq 34 over cp 2: not 4
  // halves).
  Config all_to_all = config("zigzag", 2, 34);
  EXPECT_FALSE(testing_support::check_split(all_to_all).ok());
  all_to_all.parallel.cp_kind = "all-to-all";
  Status whole = testing_support::check_split(all_to_all);
  EXPECT_TRUE(whole.ok()) << whole.error().message;

  auto c = parse_config(
      "model: {type: llama, preset: tiny}\nbatch: {global: 2, micro: 2}\n"
      "optimizer: {type: sgd, lr: 0.05}\n",
      "cp.yaml",
      {"parallel.cp=2", "model.args.moe.experts=4", "model.args.moe.capacity_factor=1.0"});
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto g = testing_support::single_device_graph(*c, ops);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("parallel.cp"), std::string::npos) << g.error().message;
  EXPECT_NE(g.error().message.find("capacity"), std::string::npos) << g.error().message;
}

}  // namespace
}  // namespace loom::plan
