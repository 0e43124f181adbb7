// A run's precision as a property of the graph: under bf16 every floating activation and model
// input is bf16, so the plan's byte counts, memory estimates and the runtime's buffers all read
// the one dtype per tensor. Parameters stay float32 (master weights: the runtime computes with a
// bf16 copy), and so do losses and the outputs of ops whose schema keeps them float32.
#pragma once

#include "core/shape.h"
#include "graph/graph.h"
#include "graph/op_registry.h"

namespace loom::graph {

// The graph with activations and floating inputs in `compute`; unchanged for kFloat32.
Graph with_compute_dtype(Graph graph, DType compute, const OpRegistry& ops);

// Whether attention runs LibTorch's fused kernel (scaled_dot_product_attention), which keeps its
// output and each query's log-sum-exp for the backward, rather than the explicit products, which
// keep the softmax probabilities [b, h, s, t]: on GPUs always; on the CPU for float32, where it
// took 0.44-0.85x their time, not for bf16, where it took 1.2-3.3x (bench/RESULTS.md). The
// runtime's kernel and the plan's memory estimate both ask here.
bool fused_attention(bool bf16, bool on_gpu);

}  // namespace loom::graph
