#include "runtime/causal_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/check.h"
#include "runtime/small_gemm.h"

namespace loom::runtime {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One (batch, head) matrix of a [b, h, n, d] tensor whose rows have unit stride: its first
// element and row stride.
struct Mat {
  float* base;
  int64_t ld;
  float* row(int64_t r) const { return base + r * ld; }
};

Mat mat(const at::Tensor& x, int64_t bi, int64_t hi) {
  return {x.data_ptr<float>() + bi * x.stride(0) + hi * x.stride(1), x.stride(2)};
}

// Queries [r0, r0 + rows) sit at positions offset + r0.., so they see keys [0, keys) with
// keys = offset + r0 + rows; query r0 + i sees the first keys - rows + i + 1 of them.
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

// ---- one row of scores -> probabilities, and back ----------------------------------------------

// p[j] = exp(x[j] - max) / sum for j < n, in place. With AVX2 and FMA the exponential is the
// classic range reduction to [-ln2/2, ln2/2] and a degree-6 polynomial (within 2 float32 ulps);
// otherwise std::exp.
void softmax_row_scalar(float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, x[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    x[j] = std::exp(x[j] - m);
    sum += x[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) x[j] *= inv;
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) inline __m256 exp_avx2(__m256 x) {
  // x <= 0 here (scores minus their row's maximum); below -87 the result is under float32's
  // smallest normal number and flushes to 0.
  const __m256 lowest = _mm256_set1_ps(-87.0f);
  const __m256 tiny = _mm256_cmp_ps(x, lowest, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lowest);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

__attribute__((target("avx2,fma"))) void softmax_row_avx2(float* x, int64_t n) {
  int64_t j = 0;
  __m256 m8 = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (; j + 8 <= n; j += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(x + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m8);
  float m = *std::max_element(lanes, lanes + 8);
  for (; j < n; ++j) m = std::max(m, x[j]);
  const __m256 mv = _mm256_set1_ps(m);
  __m256 s8 = _mm256_setzero_ps();
  for (j = 0; j + 8 <= n; j += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv));
    _mm256_storeu_ps(x + j, e);
    s8 = _mm256_add_ps(s8, e);
  }
  _mm256_store_ps(lanes, s8);
  float sum = 0.0f;
  for (float l : lanes) sum += l;
  for (; j < n; ++j) {
    x[j] = std::exp(x[j] - m);
    sum += x[j];
  }
  const __m256 inv = _mm256_set1_ps(1.0f / sum);
  for (j = 0; j + 8 <= n; j += 8)
    _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), inv));
  for (; j < n; ++j) x[j] *= 1.0f / sum;
}
#endif

void softmax_row(float* x, int64_t n) {
#if defined(__x86_64__)
  if (cpu_has_avx2_fma()) return softmax_row_avx2(x, n);
#endif
  softmax_row_scalar(x, n);
}

// The block's probabilities [rows, keys] (row stride keys) from its queries (rows of q) and the
// head's scaled, transposed keys kt [d, t]: scores, then each row's softmax over the keys its
// query sees, zeros after them.
void block_probs(const Block& blk, const float* q, int64_t ldq, const float* kt, int64_t t,
                 int64_t d, float* p) {
  gemm_rows(blk.rows, blk.keys, d, q + blk.r0 * ldq, ldq, kt, t, p, blk.keys, false);
  for (int64_t i = 0; i < blk.rows; ++i) {
    float* row = p + i * blk.keys;
    const int64_t visible = blk.keys - blk.rows + i + 1;
    softmax_row(row, visible);
    std::fill(row + visible, row + blk.keys, 0.0f);
  }
}

// dS = P ∘ (dP - rowsum(P ∘ dP)), in place of dP, times `scale`; 8 lanes at a time with AVX2.
void softmax_backward_scalar(const float* p, float* dp, int64_t rows, int64_t keys, float scale) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* pr = p + i * keys;
    float* gr = dp + i * keys;
    float dot = 0.0f;
    for (int64_t j = 0; j < keys; ++j) dot += pr[j] * gr[j];
    for (int64_t j = 0; j < keys; ++j) gr[j] = scale * pr[j] * (gr[j] - dot);
  }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void softmax_backward_avx2(const float* p, float* dp,
                                                               int64_t rows, int64_t keys,
                                                               float scale) {
  const __m256 sv = _mm256_set1_ps(scale);
  for (int64_t i = 0; i < rows; ++i) {
    const float* pr = p + i * keys;
    float* gr = dp + i * keys;
    __m256 d8 = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= keys; j += 8)
      d8 = _mm256_fmadd_ps(_mm256_loadu_ps(pr + j), _mm256_loadu_ps(gr + j), d8);
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, d8);
    float dot = 0.0f;
    for (float l : lanes) dot += l;
    for (; j < keys; ++j) dot += pr[j] * gr[j];
    const __m256 dv = _mm256_set1_ps(dot);
    for (j = 0; j + 8 <= keys; j += 8) {
      const __m256 diff = _mm256_sub_ps(_mm256_loadu_ps(gr + j), dv);
      _mm256_storeu_ps(gr + j, _mm256_mul_ps(_mm256_mul_ps(sv, _mm256_loadu_ps(pr + j)), diff));
    }
    for (; j < keys; ++j) gr[j] = scale * pr[j] * (gr[j] - dot);
  }
}
#endif

void softmax_backward_rows(const float* p, float* dp, int64_t rows, int64_t keys, float scale) {
#if defined(__x86_64__)
  if (cpu_has_avx2_fma()) return softmax_backward_avx2(p, dp, rows, keys, scale);
#endif
  softmax_backward_scalar(p, dp, rows, keys, scale);
}

// ---- the autograd function ---------------------------------------------------------------------

// A new [b, n, h, d] seen as [b, h, n, d]: the layout heads are merged from ([b, n, h * d]).
at::Tensor interleaved_heads(int64_t b, int64_t h, int64_t n, int64_t d,
                             const at::TensorOptions& options) {
  return at::empty({b, n, h, d}, options).transpose(1, 2);
}

// Rows of unit stride, as the products read them.
at::Tensor unit_rows(const at::Tensor& x) { return x.stride(3) == 1 ? x : x.contiguous(); }

// Every (batch, head) pair, split across LibTorch's intra-op threads; `f(bi, hi, scratch)` with
// `floats` of scratch per thread.
template <class F>
void for_each_head(int64_t b, int64_t h, int64_t floats, const at::TensorOptions& options,
                   const F& f) {
  at::parallel_for(0, b * h, 1, [&](int64_t begin, int64_t end) {
    at::Tensor scratch = at::empty({floats}, options);
    for (int64_t i = begin; i < end; ++i) f(i / h, i % h, scratch.data_ptr<float>());
  });
}

struct BlockCausalAttention : public torch::autograd::Function<BlockCausalAttention> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                               const at::Tensor& v_in, int64_t block_rows) {
    const at::Tensor q = unit_rows(q_in), k = unit_rows(k_in), v = unit_rows(v_in);
    const int64_t b = q.size(0), h = q.size(1), s = q.size(2), d = q.size(3), t = k.size(2);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    // The keys, scaled and transposed per head, are kept for the backward.
    at::Tensor kt = at::empty({b, h, d, t}, q.options());
    at::Tensor out = interleaved_heads(b, h, s, d, q.options());
    const std::vector<Block> all = blocks(s, t, block_rows);
    for_each_head(b, h, block_rows * t, q.options(), [&](int64_t bi, int64_t hi, float* p) {
      const Mat qm = mat(q, bi, hi), km = mat(k, bi, hi), vm = mat(v, bi, hi);
      const Mat ktm = mat(kt, bi, hi), om = mat(out, bi, hi);
      transpose_rows(km.base, km.ld, ktm.base, t, t, d, scale);
      for (const Block& blk : all) {
        block_probs(blk, qm.base, qm.ld, ktm.base, t, d, p);
        gemm_rows(blk.rows, d, blk.keys, p, blk.keys, vm.base, vm.ld, om.row(blk.r0), om.ld, false);
      }
    });
    ctx->save_for_backward({q, k, v, kt});
    ctx->saved_data["block_rows"] = block_rows;
    return {out};
  }

  // Per head and block, with P recomputed: dS = softmax'(P, dO·Vᵀ) / sqrt(d), dQ = dS·K, and,
  // transposed so that every product reads rows, dVᵀ += dOᵀ·P and dKᵀ += Qᵀ·dS. The last block
  // sees every key, so it writes dKᵀ and dVᵀ whole and the others add to a prefix of columns.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &kt = saved[3];
    const int64_t block_rows = ctx->saved_data["block_rows"].toInt();
    const int64_t b = q.size(0), h = q.size(1), s = q.size(2), d = q.size(3), t = k.size(2);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    if (!grads[0].defined())
      return {at::zeros_like(q), at::zeros_like(k), at::zeros_like(v), at::Tensor()};
    const at::Tensor g = unit_rows(grads[0]);
    at::Tensor dq = interleaved_heads(b, h, s, d, q.options());
    at::Tensor dk = interleaved_heads(b, h, t, d, q.options());
    at::Tensor dv = interleaved_heads(b, h, t, d, q.options());
    const std::vector<Block> all = blocks(s, t, block_rows);
    // Per thread: P and dP of a block, Vᵀ, dOᵀ, Qᵀ, dKᵀ and dVᵀ of a head.
    const int64_t floats = 2 * block_rows * t + 3 * d * t + 2 * d * s;
    for_each_head(b, h, floats, q.options(), [&](int64_t bi, int64_t hi, float* scratch) {
      float *p = scratch, *dp = p + block_rows * t, *vt = dp + block_rows * t;
      float *dkt = vt + d * t, *dvt = dkt + d * t, *gt = dvt + d * t, *qt = gt + d * s;
      const Mat qm = mat(q, bi, hi), km = mat(k, bi, hi), vm = mat(v, bi, hi);
      const Mat ktm = mat(kt, bi, hi), gm = mat(g, bi, hi);
      const Mat dqm = mat(dq, bi, hi), dkm = mat(dk, bi, hi), dvm = mat(dv, bi, hi);
      transpose_rows(vm.base, vm.ld, vt, t, t, d, 1.0f);
      transpose_rows(gm.base, gm.ld, gt, s, s, d, 1.0f);
      transpose_rows(qm.base, qm.ld, qt, s, s, d, 1.0f);
      for (auto it = all.rbegin(); it != all.rend(); ++it) {
        const Block& blk = *it;
        const bool accumulate = blk.keys < t;  // the last block, first here, writes every column
        block_probs(blk, qm.base, qm.ld, ktm.base, t, d, p);
        gemm_rows(blk.rows, blk.keys, d, gm.row(blk.r0), gm.ld, vt, t, dp, blk.keys, false);
        gemm_rows(d, blk.keys, blk.rows, gt + blk.r0, s, p, blk.keys, dvt, t, accumulate);
        softmax_backward_rows(p, dp, blk.rows, blk.keys, scale);
        gemm_rows(blk.rows, d, blk.keys, dp, blk.keys, km.base, km.ld, dqm.row(blk.r0), dqm.ld,
                  false);
        gemm_rows(d, blk.keys, blk.rows, qt + blk.r0, s, dp, blk.keys, dkt, t, accumulate);
      }
      transpose_rows(dkt, t, dkm.base, dkm.ld, d, t, 1.0f);
      transpose_rows(dvt, t, dvm.base, dvm.ld, d, t, 1.0f);
    });
    return {dq, dk, dv, at::Tensor()};
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
  if (block_rows <= 0) block_rows = 32;
  return BlockCausalAttention::apply(q, k, v, std::min(block_rows, q.size(2)))[0];
}

}  // namespace loom::runtime
