// The debugging environment variables of the runtime, declared in one table. None of them is
// needed to train; they exist so fault tests can stop a process at a chosen point.
#pragma once

#include <cstdint>

namespace loom::runtime {

struct DebugEnvVar {
  const char* name;
  const char* meaning;
};

inline constexpr DebugEnvVar kDebugEnv[] = {
    {"LOOM_DEBUG_KILL_AT_STEP",
     "K: SIGKILL the process in the middle of step K (1-based), on the first attempt only "
     "(LOOM_RESTART_COUNT unset or 0)"},
    {"LOOM_DEBUG_KILL_RANK",
     "R: with LOOM_DEBUG_KILL_AT_STEP, only rank R dies (default: every rank)"},
    {"LOOM_DEBUG_CKPT_CRASH_AT",
     "N: SIGKILL the process at the N-th (1-based) point of checkpoint writing: each file "
     "half-written, synced and renamed, the manifest removed, each old checkpoint pruned"},
};

// The integer value of a variable of kDebugEnv; `fallback` when unset or not a number.
int64_t debug_env_int(const char* name, int64_t fallback);
// Kills the process when LOOM_DEBUG_KILL_AT_STEP asks for `step` on this rank and attempt.
void maybe_kill_at_step(int64_t step, int64_t rank);

}  // namespace loom::runtime
