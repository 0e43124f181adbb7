#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <string>

namespace loom {

Status init_logging(int rank, std::string_view level) {
  auto parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off")
    return Error::at("logging.level", "unknown level '" + std::string(level) +
                                          "' (expected debug, info, warn or error)");
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("loom", sink);
  std::string prefix = rank >= 0 ? "[rank " + std::to_string(rank) + "] " : "";
  logger->set_pattern("[%H:%M:%S.%e] " + prefix + "[%l] %v");
  logger->set_level(parsed);
  spdlog::set_default_logger(logger);
  return Status::success();
}

void log_warning(std::string_view message) { spdlog::warn("{}", message); }

}  // namespace loom
