// What the numbers of a run depend on besides loom's code: the LibTorch build, the vector kernels
// ATen chose (ATEN_CPU_CAPABILITY), the BLAS library and its kernels, and the thread counts.
// `loom env` prints it and scripts/test states it first, so a failure report names the machine.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace loom::runtime {

// (name, value) lines, in a fixed order: libtorch, aten_cpu_capability, blas (the MKL linked into
// LibTorch), onednn, intra_op_threads, and the environment variables that move float results.
std::vector<std::pair<std::string, std::string>> describe_machine();

}  // namespace loom::runtime
