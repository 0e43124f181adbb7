// Writing files so that a crash never leaves a half-written one behind.
#pragma once

#include <filesystem>
#include <string>

#include "core/result.h"

namespace loom::cli {

// Writes to "<path>.tmp", flushes and renames it over `path`.
Status write_file_atomically(const std::filesystem::path& path, const std::string& content);

}  // namespace loom::cli
