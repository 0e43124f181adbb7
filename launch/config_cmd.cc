#include <cstdio>

#include "core/config.h"
#include "launch/command.h"
#include "launch/config_file.h"
#include "models/model.h"
#include "plan/model_check.h"

namespace loom::cli {

int config_main(const Args& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fprintf(args.empty() ? stderr : stdout,
                 "usage: loom config CONFIG [key=value ...]\n"
                 "Validates a config and prints it fully resolved (defaults included).\n");
    return args.empty() ? kExitBadInput : kExitOk;
  }
  auto config = load_config_file(args[0], Args(args.begin() + 1, args.end()));
  if (!config.ok()) {
    std::fprintf(stderr, "loom config: error: %s\n", config.error().message.c_str());
    return kExitBadInput;
  }
  // The model's keys too (model.args, model.preset) and what the split asks of the model.
  if (Status s = plan::check_model(*config, models::ModelRegistry::with_builtin_models());
      !s.ok()) {
    std::fprintf(stderr, "loom config: error: %s\n", s.error().message.c_str());
    return kExitBadInput;
  }
  std::fputs(to_yaml(*config).c_str(), stdout);
  return kExitOk;
}

}  // namespace loom::cli
