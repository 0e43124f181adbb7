#include "exec/runtime/debug_env.h"

#include <signal.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/check.h"

namespace loom::runtime {

int64_t debug_env_int(const char* name, int64_t fallback) {
  bool declared = false;
  for (const auto& v : kDebugEnv) declared = declared || std::strcmp(v.name, name) == 0;
  LOOM_CHECK(declared) << "debug environment variable " << name << " is not declared in kDebugEnv";
  const char* value = std::getenv(name);
  if (!value || !*value) return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(value, &end, 10);
  return *end == '\0' ? static_cast<int64_t>(v) : fallback;
}

void maybe_kill_at_step(int64_t step, int64_t rank) {
  if (debug_env_int("LOOM_DEBUG_KILL_AT_STEP", -1) != step) return;
  const int64_t victim = debug_env_int("LOOM_DEBUG_KILL_RANK", -1);
  if (victim >= 0 && victim != rank) return;
  const char* attempt = std::getenv("LOOM_RESTART_COUNT");
  if (attempt && std::string(attempt) != "0") return;
  raise(SIGKILL);
}

}  // namespace loom::runtime
