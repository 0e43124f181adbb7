// Causal attention on the CPU in float32, one (batch, head) at a time and within it a block of
// query rows at a time, each block multiplied only against the keys it can see. Everything of a
// head stays in the core's cache: its keys transposed and scaled, the block's scores, the
// softmax (loom's own AVX2 loop), the products on LibTorch's small-GEMM kernel (oneDNN's
// brgemm). The forward keeps no probabilities (the backward recomputes each block's, as flash
// attention does); q, k, v, the output and the gradients stay in the [b, n, h, d] layout of the
// projections. One thread, head size 64, sequences 128 to 1024: forward and backward take
// 0.47-0.64 of LibTorch's own CPU flash attention (bench/RESULTS.md, "attention in row blocks").
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace loom::runtime {

// Float32 CPU queries [b, h, s, d] and keys and values [b, h, t, d] with t >= s: query i sits at
// position t - s + i and sees the keys at or before it (a sequence-parallel piece of queries
// sees the whole prefix of keys). Returns the output [b, h, s, d] (a view of a [b, s, h, d]
// tensor, so that merging the heads costs no copy), differentiable in q, k and v.
// `block_rows` queries per block; 0 takes 32.
at::Tensor block_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  int64_t block_rows = 0);

}  // namespace loom::runtime
