// The runtime's uses of the debugging environment variables (declared in core/debug_env.h's
// one table): the fault tests' kill points.
#pragma once

#include <cstdint>

#include "core/debug_env.h"

namespace loom::runtime {

// Kills the process when LOOM_DEBUG_KILL_AT_STEP asks for `step` on this rank and attempt.
void maybe_kill_at_step(int64_t step, int64_t rank);

}  // namespace loom::runtime
