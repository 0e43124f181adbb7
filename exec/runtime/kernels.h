// The kernel registry: op type -> LibTorch function. Kernels see the op (attributes and the
// SubTensor ranges they work on) and their local input pieces, so one kernel serves every split.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/result.h"
#include "graph/op.h"

namespace loom::runtime {

using Kernel = std::function<std::vector<at::Tensor>(const graph::Op& op,
                                                     const std::vector<at::Tensor>& inputs)>;

class KernelRegistry {
 public:
  // The kernels of loom's built-in op types (graph/builtin_ops.cc).
  static KernelRegistry with_builtin_kernels();

  Status add(const std::string& type, Kernel kernel);
  const Kernel* find(const std::string& type) const;

 private:
  std::map<std::string, Kernel> kernels_;
};

}  // namespace loom::runtime
