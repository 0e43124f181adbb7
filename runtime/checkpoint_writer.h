// checkpoint.async's writer: one checkpoint at a time written on a background thread while the
// training thread goes on. The thread touches no tensor (the state was copied at the step
// boundary) and no Comm: rank 0 learns that the other ranks' shards are durable from their
// manifest parts on disk.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

#include "core/result.h"
#include "runtime/checkpoint.h"

namespace loom::runtime {

class CheckpointWriter {
 public:
  // `timeout`: how long rank 0 waits for the other ranks' shards (comm.timeout_s).
  explicit CheckpointWriter(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  ~CheckpointWriter();  // waits for the write in flight; an error is logged
  // Ends rank 0's wait for the other ranks' shards at once: the training failed, and a dead
  // rank's shard would never come (the process would linger until comm.timeout_s).
  void cancel() { cancel_ = true; }
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Starts writing `pending`; the previous write must have been waited for.
  void start(PendingCheckpoint pending);
  // Whether a write was started and not waited for yet, and whether it has finished.
  bool in_flight() const { return thread_.joinable(); }
  bool finished() const { return finished_.load(); }
  int64_t step() const { return pending_.step; }  // the step of the write in flight
  // Waits for the write in flight (none: success); its error names the checkpoint.
  Status wait();
  // The last written snapshot's shard buffer, for the next snapshot to reuse (after wait()).
  SafeTensorsWriter take_buffer() { return std::move(pending_.shard); }

 private:
  std::chrono::milliseconds timeout_;
  std::thread thread_;
  std::atomic<bool> finished_{false};
  std::atomic<bool> cancel_{false};
  PendingCheckpoint pending_;  // what the thread writes
  Status result_ = Status::success();
};

}  // namespace loom::runtime
