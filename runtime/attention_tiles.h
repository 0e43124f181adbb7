// Causal attention with each query's log-sum-exp, the kernel of ring attention's steps
// (graph/ops_context.h), computed a tile of queries at a time: the forward keeps the output and
// the log-sum-exp, and the backward recomputes each tile's probabilities from them (as flash
// attention does), so no step ever holds more than one tile's scores. Memory grows with
// tile x keys instead of queries x keys: a 16K-token chunk of Llama 3 8B's 32 heads would
// otherwise keep 32 GiB of probabilities per step.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace loom::runtime {

// Float32 queries [b, h, s, d] at positions p0.., keys and values [b, h, t, d] at positions t0..;
// a query sees the keys at or before its position and at least one must be visible to each.
// Returns the output [b, h, s, d] and the log-sum-exp of each query's scores [b, h, s], both
// differentiable (the log-sum-exp's gradient is the probabilities). `tile_rows` queries per tile;
// 0 takes as many as keep a tile's scores near 256 MiB.
std::pair<at::Tensor, at::Tensor> tiled_attention_with_lse(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& v, int64_t p0,
                                                           int64_t t0, int64_t tile_rows = 0);

}  // namespace loom::runtime
