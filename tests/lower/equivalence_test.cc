// The static equivalence proof (lower/equivalence.h) on tiny plans of every model, policy,
// schedule and memory feature: each is proven equal to one device.
#include "lower/equivalence.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lower/region.h"
#include "plan/plan.h"

namespace loom::lower {
namespace {

plan::Plan make(const std::string& yaml, const std::vector<std::string>& overrides) {
  auto c = parse_config(yaml, "equivalence_test.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  auto p = plan::make_plan(*c);
  EXPECT_TRUE(p.ok()) << p.error().message;
  return std::move(p).value();
}

constexpr const char* kGpt =
    "model: {type: gpt, preset: tiny}\nbatch: {global: 8, micro: 2}\n"
    "optimizer: {type: sgd, lr: 0.05}\n";
constexpr const char* kLlama =
    "model: {type: llama, preset: tiny}\nbatch: {global: 8, micro: 2}\n"
    "optimizer: {type: sgd, lr: 0.05}\n";
constexpr const char* kSwin =
    "model: {type: swin, preset: tiny}\nbatch: {global: 8, micro: 4}\n"
    "optimizer: {type: sgd, lr: 0.05}\n";
constexpr const char* kEvoformer =
    "model: {type: evoformer, preset: tiny}\nbatch: {global: 8, micro: 2}\n"
    "optimizer: {type: sgd, lr: 0.05}\n";
constexpr const char* kMoe =
    "model: {type: llama, preset: tiny-moe}\nbatch: {global: 8, micro: 2}\n"
    "optimizer: {type: sgd, lr: 0.05}\n";

struct Case {
  const char* name;
  const char* yaml;
  std::vector<std::string> overrides;
};

std::vector<Case> cases() {
  return {
      {"gpt_dp2", kGpt, {"parallel.dp=2"}},
      {"gpt_tp2", kGpt, {"parallel.tp=2"}},
      {"gpt_pp2", kGpt, {"parallel.pp=2"}},
      {"gpt_tp2_pp2", kGpt, {"parallel.tp=2", "parallel.pp=2"}},
      {"gpt_dp2_tp2_pp2", kGpt, {"parallel.dp=2", "parallel.tp=2", "parallel.pp=2"}},
      {"gpt_tp2_sp", kGpt, {"parallel.tp=2", "parallel.sp=true"}},
      {"gpt_zero1", kGpt, {"parallel.dp=2", "parallel.zero=1"}},
      {"gpt_zero3", kGpt, {"parallel.dp=2", "parallel.tp=2", "parallel.zero=3"}},
      {"gpt_recompute_full", kGpt, {"parallel.tp=2", "parallel.pp=2", "parallel.recompute=full"}},
      {"gpt_recompute_selective", kGpt, {"parallel.tp=2", "parallel.recompute=selective"}},
      {"gpt_1f1b", kGpt, {"parallel.pp=2", "parallel.schedule=1f1b"}},
      {"gpt_zbh1", kGpt, {"parallel.pp=2", "parallel.schedule=zb-h1"}},
      {"gpt_interleaved",
       kGpt,
       {"parallel.pp=2", "parallel.chunks=2", "parallel.schedule=interleaved",
        "model.args.layers=4"}},
      {"gpt_chimera", kGpt, {"parallel.pp=2", "parallel.schedule=chimera"}},
      {"llama_tp2_pp2", kLlama, {"parallel.tp=2", "parallel.pp=2"}},
      {"llama_cp2", kLlama, {"parallel.cp=2"}},
      {"moe_ep2", kMoe, {"parallel.dp=2", "parallel.ep=2"}},
      {"moe_ep2_tp2", kMoe, {"parallel.dp=2", "parallel.ep=2", "parallel.tp=2"}},
      {"llama_cp2_tp2_zero3", kLlama, {"parallel.cp=2", "parallel.tp=2", "parallel.zero=3"}},
      {"llama_cp2_pp2_1f1b",
       kLlama,
       {"parallel.cp=2", "parallel.pp=2", "parallel.schedule=1f1b",
        "parallel.recompute=selective"}},
      {"gpt_search", kGpt, {"parallel.pp=2", "parallel.schedule=search"}},
      {"swin_dp2_tp2", kSwin, {"parallel.dp=2", "parallel.tp=2"}},
      {"swin_window2", kSwin, {"parallel.tp=2", "parallel.policy=window"}},
      {"evoformer_dap2", kEvoformer, {"parallel.tp=2", "parallel.policy=dap"}},
      {"evoformer_dp2_pp2", kEvoformer, {"parallel.dp=2", "parallel.pp=2"}},
  };
}

class Proven : public ::testing::TestWithParam<Case> {};

TEST_P(Proven, EqualToOneDevice) {
  const Case& c = GetParam();
  const plan::Plan p = make(c.yaml, c.overrides);
  ProofStats stats;
  Status s = prove_equivalent(p.model, p.file.graph, p.file.lowered, p.file.micro_batches, &stats);
  EXPECT_TRUE(s.ok()) << s.error().to_string();
  EXPECT_GT(stats.ops, 0);
  EXPECT_EQ(stats.ranks, p.world_size());
  EXPECT_LT(stats.seconds, 1.0);
}

INSTANTIATE_TEST_SUITE_P(Plans, Proven, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace loom::lower
