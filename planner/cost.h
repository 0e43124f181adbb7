// The planner's cost model per op: floating-point operations of the forward pass and bytes of
// the activations it keeps for backward. Plain estimates, enough to balance pipeline stages
// and to compare plans; an op type's registry entry gives its count (OpRules::flops), an op
// without one a rule from the size of its operands.
#pragma once

#include <map>
#include <utility>
#include <vector>

#include "graph/graph.h"

namespace loom::planner {

// Forward FLOPs of `op` on its pieces (the backward's are scheduler::block_time's multiple).
double op_flops(const graph::Op& op);
// op_flops counted once per distinct sub-op: a sub-op's FLOPs follow from its definition, its
// pieces' shapes and its attributes (and, for an op whose rules say so, where its pieces lie),
// which every replica and most ranks and layers share (a 1024-rank plan has a few
// hundred distinct sub-ops among ~200k). One memo per thread of work.
class FlopsMemo {
 public:
  double operator()(const graph::Op& op);

 private:
  using Key = std::pair<const graph::OpDef*, std::vector<int64_t>>;
  std::map<Key, std::vector<std::pair<graph::Attrs, double>>> counted_;
  Key key_;
};
// Each op's FLOPs in `g`, by op index, counted through `memo` (one is made otherwise): what a
// plan's estimates read op by op, counted once per planned graph.
std::vector<double> graph_flops(const graph::Graph& g, FlopsMemo* memo = nullptr);
// Elements of a piece (numel of its shape, without making the shape).
int64_t piece_elements(const graph::SubTensor& piece);
// Bytes of `op`'s outputs (the activations it adds while a micro-batch is in flight).
double op_output_bytes(const graph::Graph& graph, const graph::Op& op);

}  // namespace loom::planner
