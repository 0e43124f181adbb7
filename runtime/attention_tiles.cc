#include "runtime/attention_tiles.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace loom::runtime {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Scores of queries [p0 + i, p0 + i + rows) against every key, scaled and causally masked.
at::Tensor tile_scores(const at::Tensor& q, const at::Tensor& k, int64_t i, int64_t rows,
                       int64_t p0, int64_t t0) {
  const int64_t d = q.size(3), t = k.size(2);
  at::Tensor s = at::matmul(q.narrow(2, i, rows), k.transpose(-1, -2))
                     .mul_(1.0 / std::sqrt(static_cast<double>(d)));
  const int64_t first = p0 + i;
  if (t0 + t - 1 > first) {  // some key lies after some query of the tile
    const at::Tensor qpos = at::arange(first, first + rows, q.options().dtype(at::kLong));
    const at::Tensor kpos = at::arange(t0, t0 + t, q.options().dtype(at::kLong));
    s.masked_fill_(kpos.unsqueeze(0) > qpos.unsqueeze(1), -std::numeric_limits<double>::infinity());
  }
  return s;
}

struct TiledAttention : public torch::autograd::Function<TiledAttention> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, int64_t p0, int64_t t0, int64_t tile) {
    const int64_t s = q.size(2);
    at::Tensor out = at::empty_like(q);
    at::Tensor lse = at::empty({q.size(0), q.size(1), s}, q.options());
    for (int64_t i = 0; i < s; i += tile) {
      const int64_t rows = std::min(tile, s - i);
      at::Tensor scores = tile_scores(q, k, i, rows, p0, t0);
      at::Tensor l = at::logsumexp(scores, -1);
      lse.narrow(2, i, rows).copy_(l);
      out.narrow(2, i, rows).copy_(at::matmul(scores.sub_(l.unsqueeze(-1)).exp_(), v));
    }
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["p0"] = p0;
    ctx->saved_data["t0"] = t0;
    ctx->saved_data["tile"] = tile;
    return {out, lse};
  }

  // With P = exp(S - lse): dV = P^T dO, dS = P (dO V^T - rowsum(dO O) + dlse), dQ = dS K / sqrt(d),
  // dK = dS^T Q / sqrt(d), one tile of P at a time.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const int64_t p0 = ctx->saved_data["p0"].toInt(), t0 = ctx->saved_data["t0"].toInt();
    const int64_t tile = ctx->saved_data["tile"].toInt();
    const at::Tensor d_out = grads[0].defined() ? grads[0] : at::zeros_like(out);
    at::Tensor shift = (d_out * out).sum(-1);  // rowsum(dO O), minus dlse below
    if (grads[1].defined()) shift = shift - grads[1];
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
    at::Tensor dq = at::empty_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
    const int64_t s = q.size(2);
    for (int64_t i = 0; i < s; i += tile) {
      const int64_t rows = std::min(tile, s - i);
      at::Tensor p =
          tile_scores(q, k, i, rows, p0, t0).sub_(lse.narrow(2, i, rows).unsqueeze(-1)).exp_();
      const at::Tensor d_o = d_out.narrow(2, i, rows);
      dv.add_(at::matmul(p.transpose(-1, -2), d_o));
      at::Tensor ds = at::matmul(d_o, v.transpose(-1, -2))
                          .sub_(shift.narrow(2, i, rows).unsqueeze(-1))
                          .mul_(p)
                          .mul_(scale);
      dq.narrow(2, i, rows).copy_(at::matmul(ds, k));
      dk.add_(at::matmul(ds.transpose(-1, -2), q.narrow(2, i, rows)));
    }
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::pair<at::Tensor, at::Tensor> tiled_attention_with_lse(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& v, int64_t p0,
                                                           int64_t t0, int64_t tile_rows) {
  if (tile_rows <= 0) {
    constexpr int64_t kTileScores = int64_t{1} << 26;  // float32 scores: 256 MiB
    tile_rows =
        std::max<int64_t>(1, kTileScores / std::max<int64_t>(1, q.size(0) * q.size(1) * k.size(2)));
  }
  auto outs = TiledAttention::apply(q, k, v, p0, t0, std::min(tile_rows, q.size(2)));
  return {outs[0], outs[1]};
}

}  // namespace loom::runtime
