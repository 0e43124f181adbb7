#include "runtime/debug_env.h"

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "runtime/stop_signal.h"

namespace loom::runtime {

void maybe_kill_at_step(int64_t step, int64_t rank) {
  if (debug_env_int("LOOM_DEBUG_KILL_AT_STEP", -1) != step) return;
  const int64_t victim = debug_env_int("LOOM_DEBUG_KILL_RANK", -1);
  if (victim >= 0 && victim != rank) return;
  const char* attempt = std::getenv("LOOM_RESTART_COUNT");
  if (attempt && std::string(attempt) != "0") return;
  raise(SIGKILL);
}

void maybe_hold_for_stop() {
  static int64_t calls = 0;
  if (++calls != 2) return;
  const int64_t attempt = debug_env_int("LOOM_DEBUG_HOLD_ON_RESTART", -1);
  const char* restart = std::getenv("LOOM_RESTART_COUNT");
  if (attempt < 0 || std::to_string(attempt) != (restart ? restart : "0")) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (stop_signal() == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

}  // namespace loom::runtime
