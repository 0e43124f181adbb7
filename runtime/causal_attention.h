// Causal attention on the CPU in float32, a block of query rows at a time, each block multiplied
// only against the keys it can see: the forward keeps no probabilities (the backward recomputes
// each block's from q and k, as flash attention does). Each (batch, head) product runs on
// LibTorch's small-GEMM kernel (oneDNN's brgemm), reading q, k, v, the output and the gradients
// in the [b, n, h, d] layout the projections use, with only k, v, q and the output gradient
// transposed once per head. One thread, head size 64, sequences 128 to 1024: forward and backward
// take 0.74-0.79 of LibTorch's own CPU flash attention (bench/RESULTS.md, "attention in row
// blocks").
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace loom::runtime {

// Float32 CPU queries [b, h, s, d] and keys and values [b, h, t, d] with t >= s: query i sits at
// position t - s + i and sees the keys at or before it (a sequence-parallel piece of queries
// sees the whole prefix of keys). Returns the output [b, h, s, d] (a view of a [b, s, h, d]
// tensor, so that merging the heads costs no copy), differentiable in q, k and v.
// `block_rows` queries per block; 0 takes 32, fewer where a block's scores would pass 64 MiB.
at::Tensor block_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  int64_t block_rows = 0);

}  // namespace loom::runtime
