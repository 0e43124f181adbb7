#include "runtime/debug_env.h"

#include <signal.h>

#include <cstdlib>
#include <string>

namespace loom::runtime {

void maybe_kill_at_step(int64_t step, int64_t rank) {
  if (debug_env_int("LOOM_DEBUG_KILL_AT_STEP", -1) != step) return;
  const int64_t victim = debug_env_int("LOOM_DEBUG_KILL_RANK", -1);
  if (victim >= 0 && victim != rank) return;
  const char* attempt = std::getenv("LOOM_RESTART_COUNT");
  if (attempt && std::string(attempt) != "0") return;
  raise(SIGKILL);
}

}  // namespace loom::runtime
