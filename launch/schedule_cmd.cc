#include <cstdio>

#include "launch/command.h"

namespace loom::cli {

int schedule_main(const Args&) {
  std::fprintf(stderr, "loom schedule: the scheduler is not part of this build\n");
  return kExitFailure;
}

}  // namespace loom::cli
