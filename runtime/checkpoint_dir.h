// A checkpoint directory belongs to one run: the run's id, written once into <dir>/.loom_run, and
// a lock (runtime/run_lock.h) held while the run writes there. A fresh run refuses a directory
// holding another run's checkpoints, so that pruning (checkpoint.keep) and checkpoint.resume
// latest only ever meet this run's steps; a resumed run continues the id of the run whose
// checkpoint it loaded. Nothing is written, renamed or deleted through a step_N link that leads
// out of the directory. LibTorch-free.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "core/config.h"
#include "core/result.h"
#include "runtime/run_lock.h"

namespace loom::runtime {

// Where this run's checkpoints go: checkpoint.dir, or <run.output_dir>/checkpoints.
std::filesystem::path checkpoint_root(const Config& config);

// An error naming `path` (an entry of `root`) when it is a symbolic link that leads out of
// `root`: loom never writes, renames or deletes through one.
Status check_inside(const std::filesystem::path& root, const std::filesystem::path& path);

class CheckpointDir {
 public:
  static constexpr const char* kRunFile = ".loom_run";
  static constexpr const char* kLockFile = ".loom_checkpoints.lock";

  // Claims checkpoint_root(config) for this run: creates and locks it, refuses it when it holds
  // another run's checkpoints or a step_N link leading out of it, and writes the run's id when
  // the directory has none yet. `resumed`: the checkpoint this run loaded (empty: a fresh run),
  // whose run it continues. A fresh run with run.overwrite clears another run's checkpoints
  // instead when they lie in run.output_dir. Errors name checkpoint.dir and the directory.
  static Result<std::unique_ptr<CheckpointDir>> claim(const Config& config,
                                                      const std::filesystem::path& resumed);

  const std::string& run_id() const { return run_id_; }

 private:
  CheckpointDir(std::unique_ptr<RunDirLock> lock, std::string run_id)
      : lock_(std::move(lock)), run_id_(std::move(run_id)) {}
  std::unique_ptr<RunDirLock> lock_;
  std::string run_id_;
};

}  // namespace loom::runtime
