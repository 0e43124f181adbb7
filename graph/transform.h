// Graph transforms of phase 1: split an op along a label of its annotation, replicate it, place
// it on a device, put ops in a pipeline stage. Each returns the new graph or an error naming the
// op and why; the verifier (graph/verify.h) checks the result.
#pragma once

#include <string>
#include <vector>

#include "core/result.h"
#include "graph/graph.h"

namespace loom::graph {

// The n sub-operators of `op` split along `label`: a plain label splits every tensor that has it
// (inputs and outputs together); a reduced label ("k+") splits the inputs that have it and makes
// each output a value chunk (a partial sum). Tensors without the label are read whole.
Result<std::vector<Op>> split_op(const Op& op, const std::string& label, int64_t n);
// n copies of `op` reading and writing the same pieces (to run on n devices).
std::vector<Op> replicate_op(const Op& op, int64_t n);

Result<Graph> partition(const Graph& graph, OpId op, const std::string& label, int64_t n);
Result<Graph> replicate(const Graph& graph, OpId op, int64_t n);
Result<Graph> assign(const Graph& graph, OpId op, DeviceId device);
Result<Graph> stage(const Graph& graph, const std::vector<OpId>& ops, StageId stage);

// The size of each label of `op` as its pieces stand.
Result<std::map<std::string, int64_t>> label_sizes(const Op& op);

}  // namespace loom::graph
