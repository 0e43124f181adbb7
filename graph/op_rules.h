// What planning reads of an op type besides its annotation and shapes: the forward FLOPs that
// balance pipeline stages and make the estimates, and how Megatron-style tensor (and sequence,
// and context) parallelism splits it. Part of the op's registry entry (OpSchema::rules), so a
// user's op brings its own; each op made from the entry carries them (OpDef::rules).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/shape.h"
#include "graph/attrs.h"

namespace loom::graph {

struct Op;

// What a FLOPs rule reads of an op (or a piece of it): its label sizes and attributes, and the
// op itself where a rule needs its pieces' ranges (a ring attention step's visible blocks).
struct FlopsInput {
  const std::map<std::string, int64_t>& sizes;
  const Attrs& attrs;
  const Op* op = nullptr;

  // The size of `label`; 1 where the op has none.
  double operator()(const std::string& label) const;
  // The product of every label's size.
  double product() const;
};
// Forward floating-point operations (the backward is scheduler::block_time's multiple).
using FlopsRule = std::function<double(const FlopsInput&)>;

// `factor` times the sizes of `labels` (a label may repeat: window attention's tokens).
FlopsRule flops_of_labels(double factor, std::vector<std::string> labels);
// 2 x the product of every label, whatever the rank (a matrix product).
FlopsRule matmul_flops();

// The label tensor parallelism splits, given the op's `tp` hint attribute ("column", "row" or
// empty); empty: the op names none (planner::tp_label's general rules decide).
using TensorParallelRule = std::function<std::string(const std::string& hint)>;

// Always `label` (attention's heads, the vocabulary of an embedding).
TensorParallelRule tp_split(std::string label);
// `column` for a column-parallel hint, `row` for a row-parallel one, else none.
TensorParallelRule tp_by_hint(std::string column, std::string row);

// What a saved-bytes rule reads of an op (or a piece of it).
struct SavedBytesInput {
  const Op& op;
  DType dtype;  // its first input's
  bool on_gpu = false;
};
// Bytes an op keeps for its backward besides its outputs (the estimator's activations).
using SavedBytesRule = std::function<double(const SavedBytesInput&)>;

// Attention's on [b, s, heads x d] operands (attribute d): with LibTorch's fused kernel, its
// output in the heads' layout and each query's log-sum-exp (float32); with the explicit
// products, its softmax probabilities [b, heads, s, t] and per-head copies of q, k and v
// (graph::fused_attention says which runs).
SavedBytesRule attention_saved_bytes();
// A ring attention step's (runtime/attention_tiles.h): float32 copies of its operands in the
// heads' layout, its output and each query's log-sum-exp; its probabilities exist a tile at a
// time.
SavedBytesRule ring_step_saved_bytes();

struct OpRules {
  // Unset: a few operations per element of the largest operand (planner::op_flops).
  FlopsRule flops;
  // Its FLOPs depend on where its pieces lie, not only on their sizes (a ring attention step
  // computes the blocks where a key comes at or before a query): planner::FlopsMemo counts each
  // placement apart.
  bool flops_by_position = false;
  // Unset: as one that names no label.
  TensorParallelRule tensor_parallel;
  // Outside attention and the MLP: under sequence parallelism (parallel.sp) it splits its
  // sequence label "s" instead of being replicated (norms, residual adds, a row-parallel
  // layer's bias).
  bool sequence_parallel = false;
  // The label of the heads that context parallelism's all-to-all form (Ulysses) gives each rank
  // a share of, the whole sequence of each; empty: the op splits its sequence as any other.
  std::string context_heads;
  // Its output jumps where its input crosses a tie (top-k routing): a rounding anywhere before
  // it can change what follows by a finite amount, so what a plan computes after it is compared
  // with one device against measured rounding, not a continuity bound (launch/verify.cc).
  bool discrete = false;
  // Unset: nothing besides its outputs.
  SavedBytesRule saved_bytes;
};

}  // namespace loom::graph
