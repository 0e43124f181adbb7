// Logging through spdlog's default logger, with the rank in every line so interleaved output
// from several workers stays readable: "[12:00:01.123] [rank 3] [info] ...". spdlog is included
// where it logs, not here: translation units that see LibTorch's headers would find the fmt that
// LibTorch ships before the one spdlog was built with.
#pragma once

#include <string_view>

#include "core/result.h"

namespace loom {

// Sets the line prefix and level ("debug", "info", "warn", "error"). rank < 0 omits the rank.
Status init_logging(int rank, std::string_view level);

// A warning through the same logger, for code that sees LibTorch's headers and so cannot
// include spdlog itself.
void log_warning(std::string_view message);

}  // namespace loom
