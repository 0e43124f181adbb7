// Parsing a sub-command's arguments with CLI11 the same way everywhere: help to stdout with
// exit 0, any parse error as one line on stderr with exit 2.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>

#include "launch/command.h"

namespace loom::cli {

// Parses `args` into `app`; returns the exit code when the command should stop here.
std::optional<int> parse_args(CLI::App& app, const Args& args, const char* command);

}  // namespace loom::cli
