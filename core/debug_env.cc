#include "core/debug_env.h"

#include <cstdlib>
#include <cstring>

#include "core/check.h"

namespace loom {

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

}  // namespace loom
