// metrics.jsonl: one JSON row per step, appended as each step ends. Every write's failure is
// returned naming the file: a full disk must stop the run, not end it "successfully" with the
// metrics missing.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string_view>

#include "core/result.h"

namespace loom::runtime {

class MetricsFile {
 public:
  // A run from step 0: `path` created, or emptied.
  static Result<std::unique_ptr<MetricsFile>> create(const std::filesystem::path& path);
  // A run resumed after `step` steps appends to the rows of the run it continues. The rows of
  // later steps (which that run took before it stopped, and which this one trains again) and a
  // torn last row are dropped first, through a temporary file and a rename, so that the file
  // keeps one row per step. A missing file is created; one that is not a regular file (a device,
  // a pipe) is appended to as it is.
  static Result<std::unique_ptr<MetricsFile>> resume(const std::filesystem::path& path,
                                                     int64_t step);
  ~MetricsFile();
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;

  // Appends `row` and a newline in one write, so that rows never interleave.
  Status append(std::string_view row);
  // Makes the rows appended so far durable (before a checkpoint of their step commits).
  Status sync();
  // Syncs and closes the file: where a write error the file system deferred surfaces.
  Status close();

  // How many rows resume() dropped.
  int64_t dropped_rows() const { return dropped_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  MetricsFile(int fd, std::filesystem::path path, int64_t dropped)
      : fd_(fd), path_(std::move(path)), dropped_(dropped) {}
  int fd_;
  std::filesystem::path path_;
  int64_t dropped_;
};

}  // namespace loom::runtime
