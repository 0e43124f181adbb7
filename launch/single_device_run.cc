#include "launch/single_device_run.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "comm/local_comm.h"
#include "launch/planned_trainer.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"

namespace loom::launch {

using runtime::OptimizerTrace;
using runtime::StepStats;
using runtime::Trainer;

std::map<std::string, at::Tensor> parameters_of(Trainer& trainer) {
  std::map<std::string, at::Tensor> out;
  for (const auto& tensor : trainer.graph().tensors())
    if (tensor.role == graph::TensorRole::kParameter)
      out[tensor.name] = trainer.executor().parameter(tensor.name).detach().to(at::kCPU).clone();
  return out;
}

OptimizerTrace SingleDeviceRun::trace_until(size_t steps) const {
  OptimizerTrace t = trace;
  t.lr.resize(std::min(steps, t.lr.size()));
  for (auto& [name, g] : t.grad_max) g.resize(std::min(steps, g.size()));
  return t;
}

Result<SingleDeviceRun> run_single_device(const Config& config, int64_t steps,
                                          std::shared_ptr<const Extensions> extensions) {
  SingleDeviceRun r;
  // A world of its own: under a launcher (loom verify's ranks) the environment's WORLD_SIZE is
  // the launched run's, which this one-device run is not part of.
  LOOM_ASSIGN_OR_RETURN(
      auto trainer, create_trainer(config, comm::LocalWorld(1, config.comm.timeout_s).comm(Rank(0)),
                                   nullptr, std::move(extensions)));
  r.init = parameters_of(*trainer);
  LOOM_ASSIGN_OR_RETURN(const plan::PlanSpec spec, plan::PlanSpec::of(config));
  r.trace.type = spec.optimizer;
  r.trace.precision = spec.precision;
  r.trace.momentum = spec.optimizer == OptimizerKind::kSgd ? config.optimizer.momentum : 0;
  for (int64_t i = 0; i < steps; ++i) {
    LOOM_ASSIGN_OR_RETURN(StepStats st, trainer->step());
    r.losses.push_back(st.loss);
    r.trace.lr.push_back(st.lr);
    // The gradients stay on the parameters, clipped as applied, until the next step begins.
    std::map<std::string, at::Tensor> grads;
    for (const auto& tensor : trainer->graph().tensors()) {
      if (tensor.role != graph::TensorRole::kParameter) continue;
      const at::Tensor g = trainer->executor().parameter(tensor.name).grad();
      at::Tensor host = g.defined() ? g.detach().to(at::kCPU).clone()
                                    : at::zeros(tensor.shape, at::TensorOptions(at::kFloat));
      r.trace.grad_max[tensor.name].push_back(host.abs().max().item<double>());
      grads[tensor.name] = std::move(host);
    }
    r.grads.push_back(std::move(grads));
    r.params.push_back(parameters_of(*trainer));
  }
  return r;
}

}  // namespace loom::launch
