// One run at a time in a run directory: two `loom train`s writing one run.output_dir would mix
// their metrics and overwrite each other's checkpoints. The lock is flock(2) on a file in the
// directory, so it ends with the process holding it: a killed run never leaves a stale lock.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "core/result.h"

namespace loom::runtime {

class RunDirLock {
 public:
  // The lock file, kept in the directory after the run (removing it could race a new holder).
  static constexpr const char* kFileName = ".loom.lock";

  // Locks `dir` (which must exist) for this process, without waiting, and writes this process's
  // pid into the lock file so that a refused run can name the holder. The error names the
  // directory and, when the holder wrote it, the holder's pid. `file_name`: the lock file's name
  // in `dir` (a checkpoint directory has its own, so that it may be the run directory too).
  static Result<std::unique_ptr<RunDirLock>> acquire(const std::filesystem::path& dir,
                                                     const char* file_name = kFileName);
  ~RunDirLock();  // unlocks
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  explicit RunDirLock(int fd) : fd_(fd) {}
  int fd_;
};

// Whether `dir` holds a run: the config.yaml or metrics.jsonl a run writes there.
bool holds_run(const std::filesystem::path& dir);
// Empties `dir` for a run that starts over (run.overwrite), all but its lock file and `keep`
// (paths in `dir`: this run's checkpoint directory, its event file). The error names the entry.
Status clear_run_dir(const std::filesystem::path& dir,
                     const std::vector<std::filesystem::path>& keep);

}  // namespace loom::runtime
