// LibTorch kernels of the mixture-of-experts op types (graph/ops_moe.h).
#pragma once

#include "runtime/kernels.h"

namespace loom::runtime {

// Adds the mixture-of-experts kernels to `registry` (with_builtin_kernels calls it).
void add_moe_kernels(KernelRegistry& registry);

}  // namespace loom::runtime
