// Llama's kernels against their formulas computed independently in double precision, and each
// kernel's pieces against the slices of its whole.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "graph/transform.h"
#include "models/model.h"
#include "runtime/kernels.h"
#include "tests/support/plan_chain.h"

namespace loom {
namespace {

struct Model {
  graph::OpRegistry ops = graph::OpRegistry::with_builtin_ops();
  runtime::KernelRegistry kernels = runtime::KernelRegistry::with_builtin_kernels();
  graph::Graph graph;

  explicit Model(const std::vector<std::string>& overrides) {
    auto c = parse_config("model: {type: llama, preset: tiny}\nbatch: {global: 2, micro: 2}\n",
                          "llama.yaml", overrides);
    EXPECT_TRUE(c.ok()) << c.error().message;
    auto g = testing_support::single_device_graph(*c, ops);
    EXPECT_TRUE(g.ok()) << g.error().message;
    graph = *g;
  }
  const graph::Op& op(const std::string& name) const {
    for (const auto& o : graph.ops())
      if (o.name() == name) return o;
    ADD_FAILURE() << "no op " << name;
    return graph.ops().front();
  }
  at::Tensor run(const graph::Op& o, const std::vector<at::Tensor>& in) const {
    return (*kernels.find(o.type()))(runtime::KernelContext{graph, o}, in)[0];
  }
};

double max_abs(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// Llama's rotary embedding in double: each head's pair (i, i + d/2) rotates by position x
// frequency, the frequencies theta^(-2i/d), with Llama 3.1's scaling where factor > 0.
at::Tensor rope_in_double(const at::Tensor& x, int64_t d, double theta, double factor) {
  const int64_t b = x.size(0), s = x.size(1), h = x.size(2) / d;
  at::Tensor in = x.to(at::kDouble).view({b, s, h, d});
  at::Tensor out = at::empty_like(in);
  auto src = in.accessor<double, 4>();
  auto dst = out.accessor<double, 4>();
  for (int64_t i = 0; i < d / 2; ++i) {
    double f = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    if (factor > 0) {  // low 1, high 4, original 8192
      const double wavelen = 2 * M_PI / f;
      if (wavelen > 8192) {
        f /= factor;
      } else if (wavelen >= 2048) {
        const double smooth = (8192 / wavelen - 1) / (4 - 1);
        f = (1 - smooth) * f / factor + smooth * f;
      }
    }
    for (int64_t n = 0; n < b; ++n)
      for (int64_t p = 0; p < s; ++p)
        for (int64_t k = 0; k < h; ++k) {
          const double c = std::cos(p * f), sn = std::sin(p * f);
          const double x1 = src[n][p][k][i], x2 = src[n][p][k][i + d / 2];
          dst[n][p][k][i] = x1 * c - x2 * sn;
          dst[n][p][k][i + d / 2] = x2 * c + x1 * sn;
        }
  }
  return out.view({b, s, h * d});
}

// float32 angles p * f for p < 32 are off by at most 32 x 2^-24 of a radian and cos/sin by an
// ulp: 5e-5 of |x| (randn, under 5) leaves 10x room. Swapped halves, interleaved pairs or a
// missed scaling move outputs by 1e-2 or more.
constexpr double kRopeTolerance = 5e-5;

TEST(LlamaKernels, RopeIsTheRotationOfEachHeadsHalves) {
  Model m({"model.args.rope_theta=500"});
  const graph::Op& rope = m.op("h0.attn.q_rope");
  at::manual_seed(3);
  const at::Tensor x = at::randn({2, 32, 64});
  EXPECT_LT(max_abs(m.run(rope, {x}), rope_in_double(x, 16, 500, 0)), kRopeTolerance);
}

// Head size 16 and theta 10^4: wavelengths from 6.3 to 19869 positions, so with an original
// context of 8192 (low 1, high 4) one frequency is divided by the factor, one blended, six kept.
TEST(LlamaKernels, RopeScalesFrequenciesAsLlama31) {
  Model m({"model.args.rope_factor=8"});
  const graph::Op& rope = m.op("h1.attn.k_rope");
  at::manual_seed(4);
  const at::Tensor x = at::randn({2, 32, 32});
  const at::Tensor scaled = m.run(rope, {x});
  EXPECT_LT(max_abs(scaled, rope_in_double(x, 16, 10000, 8)), kRopeTolerance);
  EXPECT_GT(max_abs(scaled, rope_in_double(x, 16, 10000, 0)), 100 * kRopeTolerance);
}

TEST(LlamaKernels, RopeOfASequencePieceStartsAtItsPosition) {
  Model m({});
  const graph::Op& rope = m.op("h0.attn.q_rope");
  at::manual_seed(5);
  const at::Tensor x = at::randn({2, 32, 64});
  const at::Tensor whole = m.run(rope, {x});
  auto parts = graph::split_op(rope, "s", 4);
  ASSERT_TRUE(parts.ok()) << parts.error().message;
  for (const graph::Op& part : *parts) {
    const graph::Range r = part.inputs[0].ranges[1];
    const at::Tensor piece = m.run(part, {x.narrow(1, r.start, r.size()).contiguous()});
    // The same float32 products per element; cos and sin may take another vector lane.
    EXPECT_LT(max_abs(piece, whole.narrow(1, r.start, r.size())), 1e-6) << part.name();
  }
}

TEST(LlamaKernels, RmsNormDividesByTheRootMeanSquare) {
  Model m({"model.args.norm_eps=0.01"});
  const graph::Op& norm = m.op("h0.attn_norm");
  at::manual_seed(6);
  const at::Tensor x = at::randn({2, 32, 64}) * 0.1, w = at::randn({64});
  const at::Tensor xd = x.to(at::kDouble);
  const at::Tensor want = w.to(at::kDouble) * xd / (xd.pow(2).mean(-1, true) + 0.01).sqrt();
  // float32 rounding of a 64-term mean and a rsqrt: a few ulps of outputs under 10. An eps left
  // out moves them by about 0.5 at |x| 0.1.
  EXPECT_LT(max_abs(m.run(norm, {x, w}), want), 1e-5);
}

TEST(LlamaKernels, SwigluIsSiluOfTheGateTimesUp) {
  Model m({});
  at::manual_seed(7);
  const at::Tensor g = at::randn({2, 32, 160}), u = at::randn({2, 32, 160});
  const at::Tensor gd = g.to(at::kDouble);
  EXPECT_LT(max_abs(m.run(m.op("h0.mlp.act"), {g, u}), gd / (1 + (-gd).exp()) * u), 1e-5);
}

// Query head i reads kv head i / (heads / kv_heads): the grouped kernel equals multi-head
// attention over kv heads repeated that way, and not over kv heads tiled (i % kv_heads).
TEST(LlamaKernels, GroupedAttentionReadsEachGroupsKvHead) {
  Model m({});
  const graph::Op& gqa = m.op("h0.attn.core");
  ASSERT_EQ(gqa.type(), "gqa_attention");
  at::manual_seed(8);
  const at::Tensor q = at::randn({2, 32, 64}), k = at::randn({2, 32, 32}),
                   v = at::randn({2, 32, 32});
  auto repeated = [](const at::Tensor& t, bool interleave) {
    at::Tensor heads = t.view({2, 32, 2, 16});
    heads = interleave ? heads.repeat_interleave(2, 2) : heads.repeat({1, 1, 2, 1});
    return heads.reshape({2, 32, 64});
  };
  Model shared_kv({"parallel.tp=4"});  // built for more ranks than kv heads
  const at::Tensor got = m.run(gqa, {q, k, v});
  const graph::Op& shared = shared_kv.op("h0.attn.core");
  ASSERT_EQ(shared.type(), "shared_kv_attention");
  // The same SDPA on the same expanded operands: equal to float32 rounding.
  const at::Tensor want = (*m.kernels.find("attention"))(
      runtime::KernelContext{m.graph, gqa}, {q, repeated(k, true), repeated(v, true)})[0];
  EXPECT_LT(max_abs(got, want), 1e-6);
  const at::Tensor tiled = (*m.kernels.find("attention"))(
      runtime::KernelContext{m.graph, gqa}, {q, repeated(k, false), repeated(v, false)})[0];
  EXPECT_GT(max_abs(got, tiled), 1e-2);
  // Shared kv heads under 4 tensor-parallel ranks: each rank's query heads [i, i+1) read their
  // group's kv head from the whole k and v.
  EXPECT_LT(max_abs(shared_kv.run(shared, {q, k, v}), want), 1e-6);
  auto parts = graph::split_op(shared, "h", 4);
  ASSERT_TRUE(parts.ok()) << parts.error().message;
  for (const graph::Op& part : *parts) {
    const graph::Range r = part.inputs[0].ranges[2];
    const at::Tensor piece =
        shared_kv.run(part, {q.narrow(2, r.start, r.size()).contiguous(), k, v});
    EXPECT_LT(max_abs(piece, want.narrow(2, r.start, r.size())), 1e-6) << part.name();
  }
}

}  // namespace
}  // namespace loom
