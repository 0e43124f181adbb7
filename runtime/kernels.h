// The kernel registry: op type -> LibTorch function. Kernels see the op (attributes and the
// SubTensor ranges they work on) and their local input pieces, so one kernel serves every split.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/result.h"
#include "graph/graph.h"

namespace loom::runtime {

// What a kernel may know besides its input pieces: the op (attributes, SubTensor ranges) and
// the full tensors' shapes.
struct KernelContext {
  const graph::Graph& graph;
  const graph::Op& op;
  // Size of dimension `dim` of the FullTensor behind input `input`.
  int64_t full_size(size_t input, size_t dim) const {
    return graph.tensor(op.inputs[input].tensor).shape[dim];
  }
};

using Kernel = std::function<std::vector<at::Tensor>(const KernelContext& ctx,
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
