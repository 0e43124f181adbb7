// Files that survive a crash at any instant: written to a temporary name, fsynced, renamed over
// the final name, and the directory fsynced, so a reader sees either the old file or the new one.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace loom {

// Called between the stages of a durable write ("half-written", "synced", "renamed"), so tests
// can stop the process at each of them.
using WriteHook = std::function<void(const char* stage)>;

// Writes `content` to `path` durably (tmp + fsync + rename + fsync of the directory).
// The error names `path`.
Status write_file_durably(const std::filesystem::path& path, std::string_view content,
                          const WriteHook& hook = {});
// The same for a file given as consecutive parts (a header and a large body), never joined in
// memory.
Status write_file_durably(const std::filesystem::path& path,
                          const std::vector<std::string_view>& parts, const WriteHook& hook = {});
// Writes `content` to `path` atomically (tmp + rename) without fsync: a reader never sees a
// half-written file, but a power loss may lose the newest content. For outputs that are cheap
// to make again (a plan dump of thousands of programs), where an fsync per file would dominate.
Status write_file_atomically(const std::filesystem::path& path, std::string_view content);
// Fsyncs a directory so the names created or removed in it are durable.
Status sync_directory(const std::filesystem::path& dir);
// Reads a whole file; the error names `path`.
Result<std::string> read_whole_file(const std::filesystem::path& path);

}  // namespace loom
