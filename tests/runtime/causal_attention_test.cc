// The CPU row-block attention kernel (runtime/causal_attention.h) against causal attention
// written out in float64: the same output and the same gradients of q, k and v, for whole
// sequences and for a sequence-parallel piece of queries, with block sizes that do and do not
// divide the sequence.
#include "runtime/causal_attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>

namespace loom::runtime {
namespace {

// The largest difference relative to the reference's largest element. The kernel sums at most
// t = 70 products of d = 16 standard-normal terms in float32 (each rounding 2^-24 of a partial
// sum), then softmax and a second sum over t: below 1e-6 of the largest element measured, so
// 2e-5 leaves room for another summation order. A wrong mask, a missing or doubled block or a
// wrong scale moves elements by their own size (order 1).
constexpr double kTolerance = 2e-5;

double relative_error(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(at::kDouble) - want).abs().max().item<double>() / want.abs().max().item<double>();
}

// Causal attention in float64 with explicit scores: query i sits at position t - s + i.
at::Tensor reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t s = q.size(2), t = k.size(2);
  at::Tensor scores =
      at::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(q.size(3)));
  const at::Tensor hidden = at::ones({s, t}, at::TensorOptions().dtype(at::kBool)).triu(t - s + 1);
  scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(scores, -1), v);
}

// q, k, v as the model hands them: heads-first views [b, h, n, d] of [b, n, h * d] tensors.
at::Tensor heads_view(const at::Tensor& x, int64_t h) {
  return x.view({x.size(0), x.size(1), h, x.size(2) / h}).transpose(1, 2);
}

void check(int64_t b, int64_t h, int64_t s, int64_t t, int64_t d, int64_t block_rows) {
  SCOPED_TRACE("b " + std::to_string(b) + " h " + std::to_string(h) + " s " + std::to_string(s) +
               " t " + std::to_string(t) + " d " + std::to_string(d) + " block_rows " +
               std::to_string(block_rows));
  at::manual_seed(11);
  const at::Tensor q0 = at::randn({b, s, h * d}), k0 = at::randn({b, t, h * d}),
                   v0 = at::randn({b, t, h * d}), g0 = at::randn({b, s, h * d});
  auto leaf = [](const at::Tensor& x, at::ScalarType dtype) {
    return x.to(dtype).detach().requires_grad_(true);
  };
  const at::Tensor q = leaf(q0, at::kFloat), k = leaf(k0, at::kFloat), v = leaf(v0, at::kFloat);
  const at::Tensor out =
      block_causal_attention(heads_view(q, h), heads_view(k, h), heads_view(v, h), block_rows)
          .transpose(1, 2)
          .reshape({b, s, h * d});
  torch::autograd::backward({out}, {g0});

  const at::Tensor qr = leaf(q0, at::kDouble), kr = leaf(k0, at::kDouble),
                   vr = leaf(v0, at::kDouble);
  const at::Tensor want = reference(heads_view(qr, h), heads_view(kr, h), heads_view(vr, h))
                              .transpose(1, 2)
                              .reshape({b, s, h * d});
  torch::autograd::backward({want}, {g0.to(at::kDouble)});

  EXPECT_LT(relative_error(out, want), kTolerance) << "output";
  EXPECT_LT(relative_error(q.grad(), qr.grad()), kTolerance) << "dq";
  EXPECT_LT(relative_error(k.grad(), kr.grad()), kTolerance) << "dk";
  EXPECT_LT(relative_error(v.grad(), vr.grad()), kTolerance) << "dv";
}

TEST(CausalAttention, WholeSequenceEqualsReference) {
  check(2, 3, 70, 70, 16, 32);  // blocks of 32, 32 and 6 rows
  check(2, 3, 70, 70, 16, 0);   // the default block
  check(1, 2, 9, 9, 12, 1);     // a row at a time; d not a multiple of 8
}

TEST(CausalAttention, SequencePieceSeesItsPrefix) {
  check(2, 3, 40, 70, 16, 16);  // the last 40 queries of 70 keys
  check(1, 2, 5, 33, 8, 4);
}

TEST(CausalAttention, MatchesScaledDotProductAttention) {
  at::manual_seed(5);
  const at::Tensor q = at::randn({2, 4, 128, 64}), k = at::randn({2, 4, 128, 64}),
                   v = at::randn({2, 4, 128, 64});
  const at::Tensor want = at::scaled_dot_product_attention(q, k, v, {}, 0.0, true);
  // Both float32; they differ only in summation order (see kTolerance).
  EXPECT_LT((block_causal_attention(q, k, v) - want).abs().max().item<double>() /
                want.abs().max().item<double>(),
            kTolerance);
}

}  // namespace
}  // namespace loom::runtime
