#include "exec/runtime/executor.h"

#include <ATen/ATen.h>

#include "exec/runtime/init.h"

namespace loom::runtime {

Executor::Executor(const graph::Graph& graph, const KernelRegistry& kernels, uint64_t seed)
    : graph_(graph), param_slot_(graph.tensors().size(), -1) {
  for (const auto& op : graph.ops()) {
    const Kernel* k = kernels.find(op.type());
    LOOM_CHECK(k) << "no kernel registered for op type '" << op.type() << "' (op " << op.name()
                  << ")";
    kernels_.push_back(k);
    for (const auto& in : op.inputs) {
      const graph::FullTensor& t = graph.tensor(in.tensor);
      if (t.role != graph::TensorRole::kParameter || param_slot_[t.id.value()] >= 0) continue;
      at::Tensor p = init_parameter_piece(t, in, seed);
      p.set_requires_grad(true);
      param_slot_[t.id.value()] = static_cast<int64_t>(params_.size());
      params_.push_back(p);
      param_ids_.push_back(t.id);
    }
  }
  std::vector<int> readers(graph.tensors().size(), 0);
  for (const auto& op : graph.ops())
    for (const auto& in : op.inputs) ++readers[in.tensor.value()];
  const auto& ops = graph.ops();
  for (size_t i = 0; i < ops.size(); ++i) unfused_steps_.push_back(Step{i});
  for (size_t i = 0; i < ops.size(); ++i) {
    Step step{i};
    if (ops[i].type() == "linear" && i + 1 < ops.size() && ops[i + 1].type() == "bias_add" &&
        ops[i + 1].inputs[0] == ops[i].outputs[0] &&
        readers[ops[i].outputs[0].tensor.value()] == 1 &&
        ops[i].outputs[0].tensor != graph.loss() && !ops[i].outputs[0].is_partial()) {
      step.fused_bias = static_cast<int64_t>(i + 1);
      ++i;
    }
    steps_.push_back(step);
  }
}

at::Tensor Executor::forward(const std::unordered_map<int64_t, at::Tensor>& inputs) const {
  return forward_all(inputs, false)[graph_.loss().value()];
}

std::vector<at::Tensor> Executor::forward_all(const std::unordered_map<int64_t, at::Tensor>& inputs,
                                              bool every_value) const {
  std::vector<at::Tensor> env(graph_.tensors().size());
  for (const auto& [id, t] : inputs) env[id] = t;
  for (size_t i = 0; i < param_ids_.size(); ++i) env[param_ids_[i].value()] = params_[i];
  std::vector<at::Tensor> args;
  const auto& ops = graph_.ops();
  auto value = [&](const graph::Op& op, const graph::SubTensor& in) -> const at::Tensor& {
    const at::Tensor& t = env[in.tensor.value()];
    LOOM_CHECK(t.defined()) << "op " << op.name() << " reads '" << graph_.tensor(in.tensor).name
                            << "' which has no value";
    return t;
  };
  for (const Step& step : every_value ? unfused_steps_ : steps_) {
    const graph::Op& op = ops[step.op];
    if (step.fused_bias >= 0) {
      const graph::Op& bias = ops[step.fused_bias];
      env[bias.outputs[0].tensor.value()] =
          at::linear(value(op, op.inputs[0]), value(op, op.inputs[1]), value(bias, bias.inputs[1]));
      continue;
    }
    args.clear();
    for (const auto& in : op.inputs) args.push_back(value(op, in));
    std::vector<at::Tensor> outs = (*kernels_[step.op])(KernelContext{graph_, op}, args);
    LOOM_CHECK(outs.size() == op.outputs.size())
        << "kernel of " << op.type() << " returned " << outs.size() << " outputs";
    for (size_t o = 0; o < outs.size(); ++o) env[op.outputs[o].tensor.value()] = std::move(outs[o]);
  }
  return env;
}

at::Tensor Executor::parameter(const std::string& name) const {
  auto id = graph_.find_tensor(name);
  if (!id || param_slot_[id->value()] < 0) return at::Tensor();
  return params_[param_slot_[id->value()]];
}

void Executor::zero_grad() {
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
}

}  // namespace loom::runtime
