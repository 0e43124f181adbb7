// loom's debugging environment variables, declared in one table. None of them is needed to
// plan or train; they exist so fault tests can stop a process at a chosen point and so a
// developer can turn on checks that release builds skip.
#pragma once

#include <cstdint>

namespace loom {

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
    {"LOOM_DEBUG_HOLD_ON_RESTART",
     "K: on attempt K (LOOM_RESTART_COUNT K), the process's second step waits for SIGTERM or "
     "SIGINT (at most 120 s) before it starts, so that an elastic test's agent joins mid-run"},
    {"LOOM_DEBUG_CKPT_CRASH_AT",
     "N: SIGKILL the process at the N-th (1-based) point of checkpoint writing: each file "
     "half-written, synced and renamed, the manifest removed, each old checkpoint pruned"},
    {"LOOM_PROFILE_STEP",
     "N: record step N (1-based) with LibTorch's profiler: every op with its time and shapes, "
     "written as a chrome trace to <run.output_dir>/profile_step_N_rank_R.json"},
    {"LOOM_DEBUG_NO_AVX2",
     "1: loom's own CPU loops (attention's softmax and its backward, the register-tile "
     "transposes) take their portable paths, as on a CPU without AVX2 and FMA"},
    {"LOOM_DEBUG_FP8_ON_CPU",
     "1: run.precision fp8 runs on the CPU, its float8 products emulated by LibTorch's CPU "
     "kernel (slow; for tests of the fp8 path on machines without a GPU)"},
    {"LOOM_VERIFY_EACH_TRANSFORM",
     "1: the planner checks the graph after every transform a policy applies and make_plan "
     "proves every plan equal to one device (lower/equivalence.h), in release builds too "
     "(debug builds and tests always do); 0: never, in debug builds too"},
};

// The integer value of a variable of kDebugEnv; `fallback` when unset or not a number.
int64_t debug_env_int(const char* name, int64_t fallback);

}  // namespace loom
