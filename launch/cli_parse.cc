#include "launch/cli_parse.h"

#include <cstdio>
#include <string>
#include <vector>

namespace loom::cli {
namespace {

// CLI11's message, except where a command with sub-commands got none it knows: then the word
// it got and the ones it takes.
std::string message(const CLI::App& app, const Args& args, const CLI::ParseError& e) {
  const std::vector<const CLI::App*> subs =
      app.get_subcommands([](const CLI::App*) { return true; });
  if (subs.empty()) return e.what();
  std::string names;
  for (size_t i = 0; i < subs.size(); ++i)
    names += (i == 0 ? "" : i + 1 == subs.size() ? " or " : ", ") + subs[i]->get_name();
  if (args.empty()) return "missing the sub-command: " + names;
  const std::string& first = args.front();
  for (const CLI::App* sub : subs)
    if (sub->get_name() == first) return e.what();
  if (!first.empty() && first[0] == '-') return e.what();
  return "unknown sub-command '" + first + "' (expected " + names + ")";
}

}  // namespace

std::optional<int> parse_args(CLI::App& app, const Args& args, const char* command) {
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 pops from the back
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "loom %s: error: %s\n", command, message(app, args, e).c_str());
    return kExitBadInput;
  }
  return std::nullopt;
}

}  // namespace loom::cli
