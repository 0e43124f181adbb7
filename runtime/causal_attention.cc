#include "runtime/causal_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "runtime/small_gemm.h"

namespace loom::runtime {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One (batch, head) matrix of a [b, h, n, d] tensor whose rows have unit stride: its first
// element, row stride and the address of row r.
struct Mat {
  float* base;
  int64_t ld;
  float* row(int64_t r) const { return base + r * ld; }
};

Mat mat(const at::Tensor& x, int64_t bi, int64_t hi) {
  return {x.data_ptr<float>() + bi * x.stride(0) + hi * x.stride(1), x.stride(2)};
}

// Every (batch, head) pair of a [b, h, ...] tensor, split across LibTorch's intra-op threads.
template <class F>
void for_each_head(int64_t b, int64_t h, const F& f) {
  at::parallel_for(0, b * h, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) f(i / h, i % h);
  });
}

// Every (batch, head) matrix of x [b, h, n, d] (unit-stride rows) transposed into a new
// contiguous [b, h, d, n], times `scale`.
at::Tensor transposed(const at::Tensor& x, double scale) {
  RECORD_FUNCTION("loom::transpose_heads", std::vector<c10::IValue>());
  const int64_t n = x.size(2), d = x.size(3);
  at::Tensor out = at::empty({x.size(0), x.size(1), d, n}, x.options());
  for_each_head(x.size(0), x.size(1), [&](int64_t bi, int64_t hi) {
    const Mat from = mat(x, bi, hi), to = mat(out, bi, hi);
    transpose_rows(from.base, from.ld, to.base, to.ld, n, d, static_cast<float>(scale));
  });
  return out;
}

// The inverse for the gradients: xt [b, h, d, n] -> [b, h, n, d] in the interleaved layout.
at::Tensor untransposed(const at::Tensor& xt) {
  RECORD_FUNCTION("loom::transpose_heads", std::vector<c10::IValue>());
  const int64_t b = xt.size(0), h = xt.size(1), d = xt.size(2), n = xt.size(3);
  at::Tensor out = at::empty({b, n, h, d}, xt.options()).transpose(1, 2);
  for_each_head(b, h, [&](int64_t bi, int64_t hi) {
    const Mat from = mat(xt, bi, hi), to = mat(out, bi, hi);
    transpose_rows(from.base, from.ld, to.base, to.ld, d, n, 1.0f);
  });
  return out;
}

// A new [b, n, h, d] seen as [b, h, n, d]: the layout heads are merged from ([b, n, h * d]).
at::Tensor interleaved_heads(int64_t b, int64_t h, int64_t n, int64_t d,
                             const at::TensorOptions& options) {
  return at::empty({b, n, h, d}, options).transpose(1, 2);
}

// Rows of unit stride, as the products above read them.
at::Tensor unit_rows(const at::Tensor& x) { return x.stride(3) == 1 ? x : x.contiguous(); }

// 0 where a query of a block sees a key of the block's diagonal tile, -inf above the diagonal.
at::Tensor diagonal_bias(int64_t rows, const at::TensorOptions& options) {
  return at::zeros({rows, rows}, options)
      .masked_fill_(at::ones({rows, rows}, options.dtype(at::kBool)).triu(1),
                    -std::numeric_limits<double>::infinity());
}

// Queries [r0, r0 + rows) sit at positions offset + r0.., so they see keys [0, keys) with
// keys = offset + r0 + rows; the last `rows` of those form the block's diagonal tile.
struct Block {
  int64_t r0, rows, keys;
};

std::vector<Block> blocks(int64_t s, int64_t t, int64_t block_rows) {
  std::vector<Block> out;
  for (int64_t r0 = 0; r0 < s; r0 += block_rows) {
    const int64_t rows = std::min(block_rows, s - r0);
    out.push_back({r0, rows, t - s + r0 + rows});
  }
  return out;
}

// A block's probabilities [b, h, rows, keys]: its queries against the keys they see, with the
// keys already scaled by 1/sqrt(d) and transposed (kt: [b, h, d, t]).
at::Tensor block_probs(const at::Tensor& q, const at::Tensor& kt, const Block& blk,
                       const at::Tensor& bias) {
  const int64_t b = q.size(0), h = q.size(1), d = q.size(3);
  at::Tensor scores = at::empty({b, h, blk.rows, blk.keys}, q.options());
  for_each_head(b, h, [&](int64_t bi, int64_t hi) {
    const Mat qm = mat(q, bi, hi), km = mat(kt, bi, hi), sm = mat(scores, bi, hi);
    gemm_rows(blk.rows, blk.keys, d, qm.row(blk.r0), qm.ld, km.base, km.ld, sm.base, sm.ld, false);
  });
  scores.narrow(3, blk.keys - blk.rows, blk.rows)
      .add_(bias.narrow(0, 0, blk.rows).narrow(1, 0, blk.rows));
  return at::_softmax(scores, -1, false);
}

struct BlockCausalAttention : public torch::autograd::Function<BlockCausalAttention> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                               const at::Tensor& v_in, int64_t block_rows) {
    const at::Tensor q = unit_rows(q_in), k = unit_rows(k_in), v = unit_rows(v_in);
    const int64_t b = q.size(0), h = q.size(1), s = q.size(2), d = q.size(3);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const at::Tensor kt = transposed(k, scale);
    const at::Tensor bias = diagonal_bias(block_rows, q.options());
    at::Tensor out = interleaved_heads(b, h, s, d, q.options());
    for (const Block& blk : blocks(s, k.size(2), block_rows)) {
      const at::Tensor probs = block_probs(q, kt, blk, bias);
      for_each_head(b, h, [&](int64_t bi, int64_t hi) {
        const Mat pm = mat(probs, bi, hi), vm = mat(v, bi, hi), om = mat(out, bi, hi);
        gemm_rows(blk.rows, d, blk.keys, pm.base, pm.ld, vm.base, vm.ld, om.row(blk.r0), om.ld,
                  false);
      });
    }
    ctx->save_for_backward({q, k, v, kt, bias});
    ctx->saved_data["block_rows"] = block_rows;
    return {out};
  }

  // Per block, with P recomputed: dS = softmax'(P, dO·Vᵀ), dQ = dS·K / sqrt(d), and, transposed
  // so that every product reads rows, dVᵀ += dOᵀ·P and dKᵀ += (Qᵀ / sqrt(d))·dS. The last block
  // sees every key, so it writes dKᵀ and dVᵀ whole and the others add to a prefix of columns.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &kt = saved[3], &bias = saved[4];
    const int64_t block_rows = ctx->saved_data["block_rows"].toInt();
    const int64_t b = q.size(0), h = q.size(1), s = q.size(2), d = q.size(3), t = k.size(2);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    if (!grads[0].defined()) {
      return {at::zeros_like(q), at::zeros_like(k), at::zeros_like(v), at::Tensor()};
    }
    const at::Tensor g = unit_rows(grads[0]);
    const at::Tensor vt = transposed(v, 1.0), gt = transposed(g, 1.0), qt = transposed(q, scale);
    at::Tensor dq = interleaved_heads(b, h, s, d, q.options());
    at::Tensor dkt = at::empty({b, h, d, t}, q.options()), dvt = at::empty_like(dkt);
    std::vector<Block> all = blocks(s, t, block_rows);
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      const Block& blk = *it;
      const bool accumulate = blk.keys < t;  // the last block, first here, writes every column
      const at::Tensor probs = block_probs(q, kt, blk, bias);
      at::Tensor d_probs = at::empty_like(probs);
      for_each_head(b, h, [&](int64_t bi, int64_t hi) {
        const Mat gm = mat(g, bi, hi), vm = mat(vt, bi, hi), dm = mat(d_probs, bi, hi);
        gemm_rows(blk.rows, blk.keys, d, gm.row(blk.r0), gm.ld, vm.base, vm.ld, dm.base, dm.ld,
                  false);
      });
      const at::Tensor d_scores = at::_softmax_backward_data(d_probs, probs, -1, at::kFloat);
      for_each_head(b, h, [&](int64_t bi, int64_t hi) {
        const Mat ds = mat(d_scores, bi, hi), pm = mat(probs, bi, hi);
        const Mat km = mat(k, bi, hi), dqm = mat(dq, bi, hi);
        gemm_rows(blk.rows, d, blk.keys, ds.base, ds.ld, km.base, km.ld, dqm.row(blk.r0), dqm.ld,
                  false);
        const Mat gtm = mat(gt, bi, hi), dvm = mat(dvt, bi, hi);
        gemm_rows(d, blk.keys, blk.rows, gtm.base + blk.r0, gtm.ld, pm.base, pm.ld, dvm.base,
                  dvm.ld, accumulate);
        const Mat qtm = mat(qt, bi, hi), dkm = mat(dkt, bi, hi);
        gemm_rows(d, blk.keys, blk.rows, qtm.base + blk.r0, qtm.ld, ds.base, ds.ld, dkm.base,
                  dkm.ld, accumulate);
      });
    }
    dq.mul_(scale);
    return {dq, untransposed(dkt), untransposed(dvt), at::Tensor()};
  }
};

}  // namespace

at::Tensor block_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  int64_t block_rows) {
  LOOM_CHECK(q.dim() == 4 && k.sizes() == v.sizes() && q.size(0) == k.size(0) &&
             q.size(1) == k.size(1) && q.size(3) == k.size(3) && k.size(2) >= q.size(2))
      << "block_causal_attention: q " << q.sizes() << ", k " << k.sizes() << ", v " << v.sizes();
  LOOM_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
             v.scalar_type() == at::kFloat && q.device().is_cpu())
      << "block_causal_attention: float32 CPU tensors only, got " << q.toString();
  RECORD_FUNCTION("loom::block_causal_attention", std::vector<c10::IValue>());
  if (block_rows <= 0) {
    constexpr int64_t kBlockRows = 32;
    constexpr int64_t kBlockScores = int64_t{1} << 24;  // float32 scores: 64 MiB
    block_rows =
        std::clamp<int64_t>(kBlockScores / (q.size(0) * q.size(1) * k.size(2)), 1, kBlockRows);
  }
  return BlockCausalAttention::apply(q, k, v, std::min(block_rows, q.size(2)))[0];
}

}  // namespace loom::runtime
