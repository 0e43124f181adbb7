// Every Comm primitive checked against closed-form values (rank r fills element i with r * n + i
// and so on). Shared by the local tests (ranks as threads) and the worker processes of the gloo
// and mpi tests, so every backend answers the same questions.
#pragma once

#include <c10/core/Device.h>

#include "comm/comm.h"
#include "core/result.h"

namespace loom::comm::testing {

// Runs every primitive on `comm` (all ranks of the group must call it) with tensors on `device`;
// the first mismatch comes back as an error naming the primitive, the rank and the element.
Status check_primitives(Comm& comm, at::Device device = at::kCPU);

// Tensors of several MiB, element counts that no chunk or rank count divides, in float32,
// bfloat16, float64 and int64: what a backend that moves data in chunks must get right at the
// edges (the gloo backend's shared memory works in chunks of at most 1 MiB per rank).
Status check_large(Comm& comm);

// Sub-groups: even/odd ranks, a reversed group, non-members getting nullptr, nested groups.
Status check_groups(Comm& comm, at::Device device = at::kCPU);

}  // namespace loom::comm::testing
