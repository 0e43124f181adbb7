// `loom env`: what this machine's numbers depend on (LibTorch, ATen's vector kernels, the BLAS
// library and its kernels, thread counts), one `name: value` line each, for bug reports.
#include <cstdio>

#include "launch/command.h"
#ifdef LOOM_HAVE_RUNTIME
#include "runtime/build_info.h"
#include "runtime/machine.h"
#endif

#ifndef LOOM_VERSION_STRING
#define LOOM_VERSION_STRING "unknown"
#endif

namespace loom::cli {

int env_main(const Args& args) {
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::fprintf(stdout,
                 "usage: loom env\n"
                 "Prints the LibTorch version, ATen's CPU capability, the BLAS library and its "
                 "kernels, and the thread settings this process runs with.\n");
    return kExitOk;
  }
  if (!args.empty()) {
    std::fprintf(stderr, "loom env: error: unexpected argument '%s'\n", args[0].c_str());
    return kExitBadInput;
  }
#ifdef LOOM_HAVE_RUNTIME
  for (const auto& [name, value] : runtime::describe_machine())
    std::printf("%s: %s\n", name.c_str(), value.c_str());
  return kExitOk;
#else
  std::fprintf(stderr,
               "loom env: error: this build of loom has no runtime (LOOM_WITH_RUNTIME=OFF)\n");
  return kExitFailure;
#endif
}

int version_main(const Args& args) {
  if (!args.empty()) {
    std::fprintf(stderr, "loom --version: error: unexpected argument '%s'\n", args[0].c_str());
    return kExitBadInput;
  }
#ifdef LOOM_HAVE_RUNTIME
  const runtime::BuildInfo b = runtime::build_info();
  std::printf("loom %s\n", b.loom.c_str());
  for (const auto& [name, value] : b.lines())
    if (name != "loom") std::printf("%s: %s\n", name.c_str(), value.c_str());
#else
  std::printf("loom %s\nlibtorch: none (built with LOOM_WITH_RUNTIME=OFF)\n", LOOM_VERSION_STRING);
#endif
  return kExitOk;
}

}  // namespace loom::cli
