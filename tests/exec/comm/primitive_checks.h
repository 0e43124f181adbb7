// Every Comm primitive checked against closed-form values (rank r fills element i with r * n + i
// and so on). Shared by the local tests (ranks as threads) and the worker processes of the gloo
// and mpi tests, so every backend answers the same questions.
#pragma once

#include "core/result.h"
#include "exec/comm/comm.h"

namespace loom::comm::testing {

// Runs every primitive on `comm` (all ranks of the group must call it); the first mismatch comes
// back as an error naming the primitive, the rank and the element.
Status check_primitives(Comm& comm);

// Sub-groups: even/odd ranks, a reversed group, non-members getting nullptr, nested groups.
Status check_groups(Comm& comm);

}  // namespace loom::comm::testing
