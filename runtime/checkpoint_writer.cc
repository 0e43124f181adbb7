#include "runtime/checkpoint_writer.h"

#include <string>

#include "core/check.h"
#include "core/log.h"

namespace loom::runtime {

CheckpointWriter::~CheckpointWriter() {
  if (Status s = wait(); !s.ok()) log_warning(s.error().message);
}

void CheckpointWriter::start(PendingCheckpoint pending) {
  LOOM_CHECK(!in_flight()) << "a checkpoint write is already in flight";
  finished_ = false;
  pending_ = std::move(pending);
  thread_ = std::thread([this] {
    result_ = write_checkpoint(pending_,
                               [&] { return await_checkpoint_parts(pending_, timeout_, cancel_); });
    finished_ = true;
  });
}

Status CheckpointWriter::wait() {
  if (!in_flight()) return Status::success();
  thread_.join();
  Status result = std::move(result_);
  result_ = Status::success();
  if (result.ok()) return result;
  Error e = result.error();
  e.message = "checkpoint of step " + std::to_string(pending_.step) +
              " (written in the background, checkpoint.async): " + e.message;
  return e;
}

}  // namespace loom::runtime
