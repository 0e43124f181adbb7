// The single-device run a plan is compared with, step by step (`loom verify`, the tests).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/result.h"
#include "runtime/tolerance.h"

namespace loom::runtime {
class Trainer;
}  // namespace loom::runtime

namespace loom::launch {

struct Extensions;

// Every parameter of a trainer's rank, detached copies on the host, by FullTensor name (on one
// rank the whole tensors).
std::map<std::string, at::Tensor> parameters_of(runtime::Trainer& trainer);

// What the single-device run did, step by step: what a plan is compared with.
struct SingleDeviceRun {
  std::vector<double> losses;                             // per step
  std::map<std::string, at::Tensor> init;                 // before the first step, by name
  std::vector<std::map<std::string, at::Tensor>> params;  // after each step, by name
  std::vector<std::map<std::string, at::Tensor>> grads;   // each step's, as applied (clipped)
  runtime::OptimizerTrace trace;                          // the updates, for the bounds
  // The trace of the first `steps` steps: what bounds the parameters after step `steps`.
  runtime::OptimizerTrace trace_until(size_t steps) const;
};

// Trains `config` as it is (one rank) for `steps` steps, keeping every step's parameters and
// gradients on the host. `extensions`: user ops and kernels (null: loom's built-ins).
Result<SingleDeviceRun> run_single_device(const Config& config, int64_t steps,
                                          std::shared_ptr<const Extensions> extensions = nullptr);

}  // namespace loom::launch
