#include "launch/cli_parse.h"

#include <cstdio>

namespace loom::cli {

std::optional<int> parse_args(CLI::App& app, const Args& args, const char* command) {
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 pops from the back
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "loom %s: error: %s\n", command, e.what());
    return kExitBadInput;
  }
  return std::nullopt;
}

}  // namespace loom::cli
