// Kernels of the Evoformer op types. Each works on whatever piece of its tensors a plan gives
// it: the head count is local (piece width / d), and a piece of a reduced axis yields its
// partial sum over the full axis's normaliser.
#include "runtime/kernels_evoformer.h"

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>

#include <cmath>

namespace loom::runtime {
namespace {

using Ctx = KernelContext;
using Tensors = std::vector<at::Tensor>;

Tensors relu(const Ctx&, const Tensors& in) { return {at::relu(in[0])}; }

Tensors sigmoid_gate(const Ctx&, const Tensors& in) { return {in[0] * at::sigmoid(in[1])}; }

// Attention along dimension 2 of [b, x, len, heads*d] inside each x; bias is
// [b, query, key, heads] shared by every x.
at::Tensor attend_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor* bias, int64_t d) {
  const int64_t b = q.size(0), x = q.size(1), len_q = q.size(2), len_k = k.size(2);
  const int64_t h = q.size(3) / d;
  auto heads = [&](const at::Tensor& t, int64_t len) {
    return t.reshape({b, x, len, h, d}).permute({0, 1, 3, 2, 4});  // [b, x, h, len, d]
  };
  at::Tensor scores = at::matmul(heads(q, len_q), heads(k, len_k).transpose(-2, -1)) *
                      (1.0 / std::sqrt(static_cast<double>(d)));
  if (bias) scores = scores + bias->permute({0, 3, 1, 2}).unsqueeze(1);  // [b, 1, h, q, k]
  // Softmax in float32 whatever the activations' dtype.
  at::Tensor out =
      at::matmul(at::softmax(scores, -1, at::kFloat).to(v.scalar_type()), heads(v, len_k));
  return out.permute({0, 1, 3, 2, 4}).reshape({b, x, len_q, h * d});
}

Tensors row_attention(const Ctx& ctx, const Tensors& in) {
  const int64_t d = ctx.op.attrs().get<int64_t>("d");
  return {attend_rows(in[0], in[1], in[2], in.size() > 3 ? &in[3] : nullptr, d)};
}

// Column attention is row attention on the transposed representation; the bias arrives as
// [b, key, query, heads].
Tensors column_attention(const Ctx& ctx, const Tensors& in) {
  const int64_t d = ctx.op.attrs().get<int64_t>("d");
  at::Tensor bias;
  if (in.size() > 3) bias = in[3].transpose(1, 2);
  at::Tensor out = attend_rows(in[0].transpose(1, 2), in[1].transpose(1, 2), in[2].transpose(1, 2),
                               bias.defined() ? &bias : nullptr, d);
  return {out.transpose(1, 2)};
}

// The mean over the full s axis, so a piece of s gives its share of the mean.
Tensors outer_product_mean(const Ctx& ctx, const Tensors& in) {
  const at::Tensor& a = in[0];
  const at::Tensor& b = in[1];
  const double n = static_cast<double>(ctx.full_size(0, 1));
  at::Tensor outer = at::einsum("bsic,bsje->bijce", {a, b}) / n;
  return {outer.reshape({a.size(0), a.size(2), b.size(2), a.size(3) * b.size(3)})};
}

Tensors triangle_outgoing(const Ctx&, const Tensors& in) {
  return {at::einsum("bikc,bjkc->bijc", {in[0], in[1]})};
}

Tensors triangle_incoming(const Ctx&, const Tensors& in) {
  return {at::einsum("bkic,bkjc->bijc", {in[0], in[1]})};
}

}  // namespace

void add_evoformer_kernels(KernelRegistry& r) {
  const std::pair<const char*, Kernel> kernels[] = {
      {"relu", relu},
      {"sigmoid_gate", sigmoid_gate},
      {"row_attention", row_attention},
      {"column_attention", column_attention},
      {"outer_product_mean", outer_product_mean},
      {"triangle_outgoing", triangle_outgoing},
      {"triangle_incoming", triangle_incoming},
  };
  for (const auto& [type, kernel] : kernels) {
    Status s = r.add(type, kernel);
    LOOM_CHECK(s.ok()) << s.error().message;
  }
}

}  // namespace loom::runtime
