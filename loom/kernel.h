// Kernels for user op types (LibTorch). A kernel receives this rank's input pieces and the op
// (attributes, the SubTensor ranges it works on) and returns its output pieces, so one kernel
// serves every split the op's annotation allows. Include only where a kernel is written.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "loom/loom.h"
#include "runtime/kernels.h"

namespace loom {

using runtime::Kernel;
using runtime::KernelContext;

// Registers the kernel of op type `type` (added with Setup::add_op).
Status add_kernel(Setup& setup, const std::string& type, Kernel kernel);

}  // namespace loom
