// TensorBoard event files (logging.tensorboard): `events.out.tfevents.<seconds>.<host>` in a
// directory, a TFRecord stream of Event protos (observe/tensorboard.proto): each record is
// [uint64 length, little-endian][uint32 masked CRC-32C of the length][data][uint32 masked
// CRC-32C of the data]. The first event holds the file version; then one event per step with one
// scalar per value. `tensorboard --logdir DIR` reads them.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"

namespace loom::observe {

// One TFRecord: the framing around `data`.
std::string tfrecord(std::string_view data);

class EventFileWriter {
 public:
  // Creates `dir` (and its parents) and a new event file in it, whose first record is the file
  // version. Events reach the operating system at most `flush_interval_s` seconds after they are
  // written (0: each at once) and when the writer closes. The error says what could not be
  // created.
  static Result<std::unique_ptr<EventFileWriter>> open(const std::string& dir,
                                                       double flush_interval_s = kFlushIntervalS);
  // One second: a step of a second or more is on disk when the next begins, and a run of short
  // steps pays one write system call a second instead of one a step (bench/tensorboard). A run
  // killed outright loses at most the last second's scalars, which metrics.jsonl also holds.
  static constexpr double kFlushIntervalS = 1.0;
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // One event at `step` holding `scalars` (tag, value; stored as float32, as TensorBoard does),
  // stamped `wall_time_s` (seconds since the Unix epoch).
  Status write_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars,
                       double wall_time_s);

  // Hands every event written so far to the operating system.
  Status flush();

  const std::string& path() const { return path_; }

 private:
  EventFileWriter(std::FILE* file, std::string path, double flush_interval_s)
      : file_(file), path_(std::move(path)), flush_interval_s_(flush_interval_s) {}
  Status write_record(std::string_view data);

  std::FILE* file_;
  std::string path_;
  double flush_interval_s_;
  std::chrono::steady_clock::time_point flushed_ = std::chrono::steady_clock::now();
};

}  // namespace loom::observe
