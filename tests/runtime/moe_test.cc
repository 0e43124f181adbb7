// Mixtures of experts: the kernels against closed forms and a dense reference, and tiny MoE GPT
// and Llama under expert parallelism (with dp, tp, pp, zero 3) against one device: ranks as
// threads over the local backend, losses and every parameter piece. One device runs the same
// micro-batches (batch.micro x parallel.dp samples), since the load-balancing loss is a product
// of per-micro-batch means, not a sum over samples. SGD keeps the parameter bounds of
// tests/support/tolerance.h tight (see llama_distributed_test.cc).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "graph/builder.h"
#include "graph/ops_moe.h"
#include "launch/planned_trainer.h"
#include "launch/verify.h"
#include "runtime/kernels.h"
#include "tests/runtime/local_ranks.h"

namespace loom {
namespace {

// Runs one op of `type` on `inputs` (float parameters of their shapes) through its kernel.
std::vector<at::Tensor> run_op(const std::string& type, const std::vector<at::Tensor>& inputs,
                               graph::Attrs attrs) {
  static const auto ops = graph::OpRegistry::with_builtin_ops();
  static const auto kernels = runtime::KernelRegistry::with_builtin_kernels();
  graph::GraphBuilder b(ops, "op");
  std::vector<TensorId> ids;
  for (size_t i = 0; i < inputs.size(); ++i)
    ids.push_back(
        b.parameter("in" + std::to_string(i), inputs[i].sizes().vec(), graph::ParamInit::zeros()));
  b.op(type, "op", ids, std::move(attrs));
  // A graph needs a scalar loss: one of its own.
  TensorId la = b.parameter("la", {1, 1}, graph::ParamInit::zeros());
  TensorId lb = b.parameter("lb", {1, 1}, graph::ParamInit::zeros());
  b.set_loss(b.op1("nll", "loss", {la, lb}, graph::Attrs{{"normalizer", int64_t{1}}}));
  auto g = b.finish();
  EXPECT_TRUE(g.ok()) << g.error().message;
  if (!g.ok()) return {};
  return (*kernels.find(type))(runtime::KernelContext{*g, g->ops()[0]}, inputs);
}

// Hand-made routing: 4 tokens, 2 experts, top 1 of the softmax. Tokens 0-2 prefer expert 0
// (scores p, 1 - p), token 3 expert 1. counts = (3, 1); score sums = (2.7 + q, 0.3 + 1 - q).
TEST(MoeKernels, AuxLossEqualsItsClosedForm) {
  const double p = 0.9, q = 0.2;  // softmax of (log p, log(1 - p)) is (p, 1 - p)
  at::Tensor logits = at::tensor({std::log(p), std::log(1 - p), std::log(p), std::log(1 - p),
                                  std::log(p), std::log(1 - p), std::log(q), std::log(1 - q)},
                                 at::kFloat)
                          .reshape({1, 4, 2});
  auto stats = run_op(graph::kMoeLoadStats, {logits}, {{"top_k", int64_t{1}}});
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_TRUE(at::allclose(stats[0], at::tensor({3.0f, 1.0f})));
  EXPECT_TRUE(at::allclose(stats[1], at::tensor({float(3 * p + q), float(3 * (1 - p) + 1 - q)})));
  const double coef = 0.01;
  auto aux = run_op(
      graph::kMoeAuxLoss, {stats[0], stats[1]},
      {{"coef", coef}, {"experts", int64_t{2}}, {"top_k", int64_t{1}}, {"tokens", int64_t{4}}});
  // Switch: coef x E x sum_x f_x P_x, f = counts / T, P = score sums / T.
  const double f0 = 3.0 / 4, f1 = 1.0 / 4, p0 = (3 * p + q) / 4, p1 = (3 * (1 - p) + 1 - q) / 4;
  const double expected = coef * 2 * (f0 * p0 + f1 * p1);
  EXPECT_NEAR(aux[0].item<double>(), expected, 1e-6 * expected);  // float32 sums of 4 terms
  // A balanced router (f = P = 1/2) gives coef exactly: the loss's minimum.
  auto balanced = run_op(
      graph::kMoeAuxLoss, {at::tensor({2.0f, 2.0f}), at::tensor({2.0f, 2.0f})},
      {{"coef", coef}, {"experts", int64_t{2}}, {"top_k", int64_t{1}}, {"tokens", int64_t{4}}});
  EXPECT_NEAR(balanced[0].item<double>(), coef, 1e-9);
}

// The route: top-k gates normalised to 1; with a capacity of 2 slots the third and later token
// of a sample choosing an expert (in sequence order) lose it.
TEST(MoeKernels, RouteKeepsTheFirstTokensUpToTheCapacity) {
  // 1 sample, 5 tokens, 3 experts, top 1 without normalisation: every token prefers expert 0
  // but token 3, which prefers expert 2.
  at::Tensor logits = at::zeros({1, 5, 3});
  logits.select(2, 0).fill_(2.0);
  logits[0][3][0] = 0;
  logits[0][3][2] = 2.0;
  auto w = run_op(graph::kMoeRoute, {logits}, {{"top_k", int64_t{1}}, {"c", int64_t{2}}})[0];
  const at::Tensor routed = (w != 0).to(at::kLong);
  // Tokens 0 and 1 take expert 0's slots; 2 and 4 are dropped; 3 goes to expert 2.
  EXPECT_TRUE(at::equal(routed.sum(2), at::tensor({1, 1, 0, 1, 0}, at::kLong).reshape({1, 5})));
  EXPECT_EQ(routed[0][3][2].item<int64_t>(), 1);
  // Top 2, normalised: each token's gates sum to 1.
  at::Tensor random = at::randn({2, 6, 4}, at::TensorOptions().dtype(at::kFloat));
  auto w2 = run_op(graph::kMoeRoute, {random}, {{"top_k", int64_t{2}}})[0];
  EXPECT_TRUE(at::allclose(w2.sum(2), at::ones({2, 6})));
  EXPECT_TRUE(at::equal((w2 != 0).sum(2), at::full({2, 6}, 2, at::kLong)));
}

// Dispatch, two experts' linears with SwiGLU, combine: equals the dense form
// y_t = sum_x w[t, x] down_x(silu(gate_x h_t) * up_x h_t), forward and gradients, with and
// without a capacity (a dropped token's expert contributes nothing).
void expect_moe_equals_dense(int64_t capacity) {
  at::manual_seed(3);
  const int64_t b = 2, s = 7, m = 5, e = 4, f = 6;
  const auto dbl = at::TensorOptions().dtype(at::kDouble);
  at::Tensor x = at::randn({b, s, m}, dbl).requires_grad_(true);
  at::Tensor logits = at::randn({b, s, e}, dbl).requires_grad_(true);
  at::Tensor wg = at::randn({e, f, m}, dbl).requires_grad_(true);
  at::Tensor wu = at::randn({e, f, m}, dbl).requires_grad_(true);
  at::Tensor wd = at::randn({e, m, f}, dbl).requires_grad_(true);
  graph::Attrs route{{"top_k", int64_t{2}}};
  if (capacity > 0) route.set("c", capacity);
  at::Tensor w = run_op(graph::kMoeRoute, {logits}, route)[0];
  const int64_t slots = capacity > 0 ? capacity : s;
  at::Tensor buf = run_op(graph::kMoeDispatch, {x, w}, {{"c", slots}})[0];
  at::Tensor g = run_op(graph::kExpertLinear, {buf, wg}, {})[0];
  at::Tensor u = run_op(graph::kExpertLinear, {buf, wu}, {})[0];
  at::Tensor y = run_op(graph::kExpertLinear, {at::silu(g) * u, wd}, {})[0];
  at::Tensor out = run_op(graph::kMoeCombine, {y, w}, {})[0];
  // Dense: every expert on every token, weighted by w (0 where not routed or dropped).
  at::Tensor dg = at::einsum("bsm,efm->bsef", {x, wg}), du = at::einsum("bsm,efm->bsef", {x, wu});
  at::Tensor dy = at::einsum("bsef,emf->bsem", {at::silu(dg) * du, wd});
  at::Tensor dense = (dy * w.to(at::kDouble).unsqueeze(-1)).sum(2);
  ASSERT_EQ(out.sizes(), dense.sizes());
  EXPECT_TRUE(at::allclose(out, dense, 1e-10, 1e-12));  // float64: only summation order differs
  const at::Tensor seed = at::randn_like(dense);
  const std::vector<at::Tensor> leaves = {x, logits, wg, wu, wd};
  auto grads_of = [&](const at::Tensor& result) {
    for (const at::Tensor& l : leaves)
      if (l.grad().defined()) l.mutable_grad().zero_();
    (result * seed).sum().backward({}, /*retain_graph=*/true);
    std::vector<at::Tensor> out;
    for (const at::Tensor& l : leaves) out.push_back(l.grad().clone());
    return out;
  };
  const std::vector<at::Tensor> got = grads_of(out), want = grads_of(dense);
  const char* names[] = {"x", "logits", "gate", "up", "down"};
  for (size_t i = 0; i < got.size(); ++i) {
    // The router's scores are float32 in both (moe_route), the rest float64.
    const double rtol = i == 1 ? 1e-5 : 1e-10;
    EXPECT_TRUE(at::allclose(got[i], want[i], rtol, 1e-12))
        << names[i] << ": max difference " << (got[i] - want[i]).abs().max().item<double>();
  }
  if (capacity > 0) {  // some token lost an expert, so the capacity was exercised
    EXPECT_LT((w != 0).sum().item<int64_t>(), b * s * 2);
  }
}

TEST(MoeKernels, DroplessEqualsTheDenseForm) { expect_moe_equals_dense(0); }
TEST(MoeKernels, CapacityEqualsTheDenseFormOfWhatIsKept) { expect_moe_equals_dense(2); }

// ---- Plans against one device ----

constexpr int kSteps = 4;
constexpr int64_t kMicroBatchSamples = 4;  // batch.micro x parallel.dp, fixed so aux losses agree

Config config(const std::string& type, int64_t dp, const std::vector<std::string>& more) {
  const std::string yaml =
      "run: {seed: 7, steps: 4}\nmodel: {type: " + type +
      ", preset: tiny-moe}\nbatch: {global: 8, micro: " + std::to_string(kMicroBatchSamples / dp) +
      "}\noptimizer: {type: sgd, lr: 0.3, momentum: 0.9, weight_decay: "
      "0.01, clip_grad_norm: 1.0}\ncomm: {timeout_s: 60}\n";
  std::vector<std::string> overrides = {"parallel.dp=" + std::to_string(dp)};
  overrides.insert(overrides.end(), more.begin(), more.end());
  auto c = parse_config(yaml, type + "-moe.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

void expect_equal(const std::string& type, int64_t dp, const std::vector<std::string>& more,
                  int world_size, const std::vector<std::string>& ref_more = {}) {
  const testing_support::Reference ref =
      testing_support::train_single_device(config(type, 1, ref_more), kSteps);
  std::vector<std::string> all = more;
  all.insert(all.end(), ref_more.begin(), ref_more.end());
  // GPT's key bias shifts every score of a query alike: its gradient is rounding noise.
  testing_support::expect_equal_to_single_device(ref, config(type, dp, all), world_size,
                                                 launch::rounding_noise_parameters());
}

TEST(GptMoeLocalRanks, Ep2) { expect_equal("gpt", 2, {"parallel.ep=2"}, 2); }
TEST(GptMoeLocalRanks, Ep4) { expect_equal("gpt", 4, {"parallel.ep=4"}, 4); }
// Two ep groups of 2: each expert lives on 2 ranks, its gradients summed over the groups.
TEST(GptMoeLocalRanks, Dp4Ep2) { expect_equal("gpt", 4, {"parallel.ep=2"}, 4); }
TEST(GptMoeLocalRanks, Ep2Tp2) { expect_equal("gpt", 2, {"parallel.ep=2", "parallel.tp=2"}, 4); }
TEST(GptMoeLocalRanks, Ep2Pp2) { expect_equal("gpt", 2, {"parallel.ep=2", "parallel.pp=2"}, 4); }
TEST(GptMoeLocalRanks, Ep2Zero3) {
  expect_equal("gpt", 2, {"parallel.ep=2", "parallel.zero=3"}, 2);
}

TEST(LlamaMoeLocalRanks, Ep2) { expect_equal("llama", 2, {"parallel.ep=2"}, 2); }
TEST(LlamaMoeLocalRanks, Ep4) { expect_equal("llama", 4, {"parallel.ep=4"}, 4); }
TEST(LlamaMoeLocalRanks, Ep2Tp2Sp) {
  expect_equal("llama", 2, {"parallel.ep=2", "parallel.tp=2", "parallel.sp=true"}, 4);
}
TEST(LlamaMoeLocalRanks, Ep2Pp2OneFOneB) {
  expect_equal("llama", 2, {"parallel.ep=2", "parallel.pp=2"}, 4);
}
TEST(LlamaMoeLocalRanks, Ep2Zero3FullRecompute) {
  expect_equal("llama", 2, {"parallel.ep=2", "parallel.zero=3", "parallel.recompute=full"}, 2);
}
// The split backward (the experts' weight gradients come in the I block, the linears' wait for
// W) and a looped schedule over 4 layers.
TEST(LlamaMoeLocalRanks, Ep2Pp2ZeroBubble) {
  expect_equal("llama", 2, {"parallel.ep=2", "parallel.pp=2", "parallel.schedule=zb-h1"}, 4);
}
TEST(GptMoeLocalRanks, Ep2Pp2Interleaved) {
  expect_equal(
      "gpt", 2,
      {"parallel.ep=2", "parallel.pp=2", "parallel.chunks=2", "parallel.schedule=interleaved"}, 4,
      {"model.args.layers=4"});
}
// With a capacity (2 slots per expert and sample of 32 tokens, top 2 of 4: most tokens are
// dropped), every plan drops the same tokens: the losses could not agree otherwise.
TEST(LlamaMoeLocalRanks, CapacityEp2Tp2) {
  expect_equal("llama", 2, {"parallel.ep=2", "parallel.tp=2"}, 4,
               {"model.args.moe.capacity_factor=0.125", "model.args.moe.shared_experts=1"});
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// The load-balancing loss is reported on its own (moe_aux_loss) and is the same under ep2 x tp2
// as on one device: each layer's loss counted once whatever ranks hold it.
TEST(MoeMetrics, AuxLossIsReportedOnceUnderEveryPlan) {
  auto aux_of = [](const Config& c, int world_size) {
    comm::LocalWorld world(world_size, 60);
    std::vector<double> aux(static_cast<size_t>(world_size), -1);
    auto statuses = world.run([&](comm::Comm& comm) -> Status {
      at::set_num_threads(1);
      LOOM_ASSIGN_OR_RETURN(auto trainer, launch::create_trainer(c, comm.shared_from_this()));
      LOOM_ASSIGN_OR_RETURN(auto st, trainer->step());
      if (!st.has_moe_aux) return Error::at("test", "no moe_aux_loss reported");
      aux[static_cast<size_t>(comm.world_rank().value())] = st.moe_aux_loss;
      // The busiest expert took more than its share, and at most all k x T choices of the
      // 4 x 32 tokens of a micro-batch (E / k = 2 times the mean).
      if (!(st.moe_max_load >= 1.0 && st.moe_max_load <= 2.0))
        return Error::at("test", "moe_max_load " + std::to_string(st.moe_max_load));
      return Status::success();
    });
    for (const Status& s : statuses) EXPECT_TRUE(s.ok()) << s.error().message;
    return aux;
  };
  const std::vector<double> one = aux_of(config("llama", 1, {}), 1);
  const std::vector<double> plan =
      aux_of(config("llama", 2, {"parallel.ep=2", "parallel.tp=2"}), 4);
  // Two layers of coef 0.01 x E sum f P, which is 1 for a balanced router: about 0.02.
  EXPECT_GT(one[0], 0.01);
  EXPECT_LT(one[0], 0.1);
  for (double a : plan) EXPECT_NEAR(a, one[0], 1e-6 * one[0]);  // float32 sums of 64 tokens
}

}  // namespace
}  // namespace loom
