// The runtime's uses of the debugging environment variables (declared in core/debug_env.h's
// one table): the fault tests' kill and hold points.
#pragma once

#include <cstdint>

#include "core/debug_env.h"

namespace loom::runtime {

// Kills the process when LOOM_DEBUG_KILL_AT_STEP asks for `step` on this rank and attempt.
void maybe_kill_at_step(int64_t step, int64_t rank);
// Holds the process's second step until a stop signal when LOOM_DEBUG_HOLD_ON_RESTART names this
// attempt.
void maybe_hold_for_stop();

}  // namespace loom::runtime
