// LibTorch kernels of the vision op types (graph/ops_vision.h).
#pragma once

#include "runtime/kernels.h"

namespace loom::runtime {

// Adds the vision kernels to `registry` (with_builtin_kernels calls it).
void add_vision_kernels(KernelRegistry& registry);

}  // namespace loom::runtime
