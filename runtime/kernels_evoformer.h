// Kernels of the Evoformer op types (graph/ops_evoformer.h).
#pragma once

#include "runtime/kernels.h"

namespace loom::runtime {

// Adds the Evoformer kernels to `registry`; KernelRegistry::with_builtin_kernels() calls it.
void add_evoformer_kernels(KernelRegistry& registry);

}  // namespace loom::runtime
