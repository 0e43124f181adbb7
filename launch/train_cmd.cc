#include <cstdio>

#include "launch/command.h"

namespace loom::cli {

int train_main(const Args&) {
  std::fprintf(stderr, "loom train: this build has no runtime (configured with LOOM_WITH_RUNTIME=OFF)\n");
  return kExitFailure;
}

}  // namespace loom::cli
