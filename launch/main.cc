// `loom`: the command-line entry point. Dispatches to one sub-command per verb.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "launch/command.h"

namespace {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const loom::cli::Args&);
};

const Command kCommands[] = {
    {"train", "train a model: loom train CONFIG [key=value ...]", loom::cli::train_main},
    {"schedule", "build, search, simulate and draw a pipeline schedule", loom::cli::schedule_main},
    {"plan", "make and dump a plan without processes: loom plan CONFIG --out DIR",
     loom::cli::plan_main},
    {"verify", "compare a plan with one device: loom verify CONFIG [key=value ...] [--steps N]",
     loom::cli::verify_main},
    {"checkpoint", "inspect or merge a checkpoint: loom checkpoint inspect DIR | merge DIR OUT",
     loom::cli::checkpoint_main},
    {"data",
     "token datasets: loom data prepare --tokenizer HF_DIR --out PREFIX INPUT... | inspect PREFIX",
     loom::cli::data_main},
    {"config", "print the resolved config: loom config CONFIG [key=value ...]",
     loom::cli::config_main},
    {"calibrate", "measure this machine into a cost model: loom calibrate [CONFIG] [--out FILE]",
     loom::cli::calibrate_main},
    {"env", "print what results depend on: LibTorch, CPU kernels, BLAS, threads",
     loom::cli::env_main},
};

void usage(FILE* out) {
  std::fprintf(out, "usage: loom COMMAND [ARGS ...]\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out,
               "\nRun 'loom COMMAND --help' for a command's options; 'loom --version' for "
               "the versions of loom, LibTorch, CUDA and NCCL.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return loom::cli::kExitBadInput;
  }
  std::string verb = argv[1];
  if (verb == "-h" || verb == "--help" || verb == "help") {
    usage(stdout);
    return loom::cli::kExitOk;
  }
  if (verb == "--version" || verb == "-V" || verb == "version")
    return loom::cli::version_main(loom::cli::Args(argv + 2, argv + argc));
  for (const auto& c : kCommands) {
    if (verb != c.name) continue;
    loom::cli::Args args(argv + 2, argv + argc);
    try {
      return c.run(args);
    } catch (const std::exception& e) {
      // Only a bug in loom gets here: user mistakes are reported by the commands themselves.
      std::fprintf(stderr, "loom %s: internal error: %s\n", c.name, e.what());
      return loom::cli::kExitFailure;
    }
  }
  std::fprintf(stderr, "loom: unknown command '%s'\n\n", verb.c_str());
  usage(stderr);
  return loom::cli::kExitBadInput;
}
