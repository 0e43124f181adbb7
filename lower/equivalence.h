// The static proof that a lowered plan computes the single-device model (`loom verify
// --static`, and a pass of make_plan in debug builds and tests). Nothing runs: every rank's
// program is walked over regions of the single-device tensors (lower/region.h):
//  - ops: each sub-operator is its single-device op (type, annotation, attributes, tensors) on
//    a region: every label of the annotation has one range across all its pieces, unsplittable
//    labels are whole, inputs are whole values, and the output holds exactly the partial sum its
//    reduced labels' ranges make; the sub-ops of one op write each output region exactly once,
//    their partial sums tiling the value and their reduced ranges the reduction;
//  - adapters: each forward path, run step by step on the regions the producers' ops write,
//    leaves every consuming rank exactly the region its ops read, a whole value; each gradient
//    path, run from the consumers' gradients, leaves every producer its gradient (replicas'
//    partials summing to the whole exactly once; lower/program.h's grad_layout);
//  - programs: each op on exactly one rank, its own, in its stage's segment; each value made or
//    delivered before an op reads it, in item order; every rank of an adapter's steps runs it
//    once; per stage and micro-batch one forward before one backward (or input- then
//    weight-gradient); values read across stages on one rank made in an earlier block; each
//    micro-batch through exactly one copy of the model (Chimera's two pipelines are two);
//  - gradients: each parameter piece read on several ranks summed over exactly those ranks,
//    once; parallel.zero 3 shards tiling each parameter once, their gathers and reduce-scatters
//    proven as adapters; the ZeRO-1 split of every gradient group owning each element once;
//    the loss seeded 1 / its replicas on exactly the ranks holding it;
//  - recomputation: regions inside their segment, disjoint, repeating no pipeline transfer and
//    not making the loss (what a region reads from outside is kept whatever its bounds).
// It does not prove kernels or numerics (that is the run-based `loom verify`), nor the data
// each replica reads, nor the order of floating-point sums. LibTorch-free.
#pragma once

#include <cstdint>

#include "core/result.h"
#include "graph/graph.h"
#include "lower/program.h"

namespace loom::lower {

struct ProofStats {
  int64_t ops = 0;         // sub-operators checked against their single-device op
  int64_t adapters = 0;    // adapters whose forward and gradient paths ran on regions
  int64_t ranks = 0;       // programs walked
  int64_t blocks = 0;      // program blocks checked
  int64_t grad_syncs = 0;  // gradient syncs checked
  double seconds = 0;      // wall time of the proof
};

// Proves `lowered` (the programs of `planned`, `micro_batches` per step) equal to `single`, the
// single-device model it was planned from. The error names the first difference: the rank, the
// op or adapter, the tensor and the region, and what one device needs there.
Status prove_equivalent(const graph::Graph& single, const graph::Graph& planned,
                        const Lowered& lowered, int64_t micro_batches, ProofStats* stats = nullptr);

}  // namespace loom::lower
