// parallel.zero 3 as layouts: each parameter stored split over the devices that read it, and
// gathered for each read by an adapter whose path comes from the same search as every other.
//
// A parameter whose readers' pieces form a layout with R replicas is stored as that layout with
// R moved into the first dimension whose piece R divides (a local R→D chunk: each reader keeps
// 1/R of its piece). Every op reading it gets an adapter (Adapter::parameter) from the stored
// layout to the layout it reads: the search finds the D→R all-gather, and for the gradient its
// mirror, the V→D reduce-scatter, which replaces the parameter's gradient sync. A linear's
// weight is gathered again for its backward instead of being kept (Adapter::regather). With
// tensor parallelism the replicas are the data-parallel ones (and, for pieces tensor
// parallelism replicates, such as layer norms, the tensor-parallel ones too), so the same rule
// composes with tp, sp and pp.
//
// A parameter stays replicated, with its gradient sync, when it has no replicas, when it is read
// in several stages (a tied embedding and LM head on different pipeline stages: its readers do
// not run at the same time), when its readers read different layouts, or when R divides none of
// its piece's dimensions.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/result.h"
#include "graph/graph.h"
#include "lower/program.h"

namespace loom::lower {

// Adds the parameter adapters to `out` and each one's id to `op_adapters` of the ops reading
// through it; returns the parameters stored split (they get no gradient sync).
Result<std::set<int64_t>> shard_parameters(const graph::Graph& g, PathFinder& paths, Lowered& out,
                                           std::vector<std::vector<int64_t>>& op_adapters);

// Per (parameter, reading op's name): the parameter adapter the op reads it through.
std::map<std::pair<int64_t, std::string>, const Adapter*> parameter_adapters(const Lowered& l);
// The piece of parameter adapter `a`'s tensor (of `shape`) that `device` stores.
graph::SubTensor stored_piece(const Adapter& a, DeviceId device, const Shape& shape);

// The dimension a piece of `piece_shape` read by `replicas` devices is stored split along: the
// first the replicas divide, or -1.
int64_t shard_dim(const Shape& piece_shape, int64_t replicas);

}  // namespace loom::lower
