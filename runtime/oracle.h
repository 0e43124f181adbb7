// The per-op oracle: proves a plan's sub-operators correct before any communication exists.
// Every sub-op runs on its input pieces cut from the single-device run's tensors (a value chunk
// i of n gets 1/n of the values), and its outputs must equal the pieces they claim: the slice,
// or for value chunks, parts that add up to the slice.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "graph/graph.h"
#include "runtime/kernels.h"
#include "runtime/oracle_report.h"

namespace loom::runtime {

// The value of every tensor of a one-device graph (by tensor id: inputs from `inputs`, parameters
// drawn from `seed` as the executor draws them, every activation), op by op without autograd:
// what the oracle cuts pieces from.
std::vector<at::Tensor> reference_values(const graph::Graph& single, const KernelRegistry& kernels,
                                         uint64_t seed,
                                         const std::unordered_map<int64_t, at::Tensor>& inputs);

// How far a sub-op's float32 output may stand from its piece of the single-device value,
// relative to the piece's largest magnitude. ATen picks a kernel's blocking and vector path by
// shape, stride and CPU, so a piece and its whole take different paths: on one CI machine a
// vocabulary group's log-sum-exp moved by 3.6e-5 while this machine measures under 1e-6 for every
// sub-op of GPT tiny. 1e-4 leaves room for that; a bias counted twice or a piece cut from the
// wrong place differs by 1e-3 to 1 (oracle_test's Catches* tests).
inline constexpr double kOracleTolerance = 1e-4;

// `full` holds the single-device value of every FullTensor of `planned` (by tensor id), e.g.
// from reference_values. Relative tolerance against the largest magnitude of each piece.
OracleReport check_plan_ops(const graph::Graph& planned, const std::vector<at::Tensor>& full,
                            const KernelRegistry& kernels, double tolerance = kOracleTolerance);

// The slice of `full` that `piece` covers, divided by its value chunk count.
at::Tensor cut_piece(const at::Tensor& full, const graph::SubTensor& piece);

}  // namespace loom::runtime
