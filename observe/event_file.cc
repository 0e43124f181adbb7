#include "observe/event_file.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "observe/crc32c.h"
#include "observe/tensorboard.pb.h"

namespace loom::observe {
namespace {

std::string little_endian(uint64_t v, int bytes) {
  std::string out(static_cast<size_t>(bytes), '\0');
  for (int i = 0; i < bytes; ++i) out[static_cast<size_t>(i)] = static_cast<char>(v >> (8 * i));
  return out;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "localhost";
  return host;
}

}  // namespace

std::string tfrecord(std::string_view data) {
  const std::string length = little_endian(data.size(), 8);
  std::string out = length;
  out += little_endian(masked_crc32c(length), 4);
  out += data;
  out += little_endian(masked_crc32c(data), 4);
  return out;
}

Result<std::unique_ptr<EventFileWriter>> EventFileWriter::open(const std::string& dir,
                                                               double flush_interval_s) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Error::at(dir, "cannot create '" + dir + "': " + ec.message());
  const double wall = now_s();
  // TensorBoard's name: a new file per run, so a resumed run adds one next to the old.
  const fs::path path =
      fs::path(dir) / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(wall)) + "." +
                       host_name() + "." + std::to_string(getpid()));
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (!file) return Error::at(dir, "cannot write '" + path.string() + "': " + std::strerror(errno));
  std::unique_ptr<EventFileWriter> writer(
      new EventFileWriter(file, path.string(), flush_interval_s));
  tensorboard::Event version;
  version.set_wall_time(wall);
  version.set_file_version("brain.Event:2");
  LOOM_TRY(writer->write_record(version.SerializeAsString()));
  LOOM_TRY(writer->flush());
  return writer;
}

EventFileWriter::~EventFileWriter() { std::fclose(file_); }

Status EventFileWriter::write_scalars(int64_t step,
                                      const std::vector<std::pair<std::string, double>>& scalars,
                                      double wall_time_s) {
  tensorboard::Event event;
  event.set_wall_time(wall_time_s);
  event.set_step(step);
  tensorboard::Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    tensorboard::SummaryValue* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  return write_record(event.SerializeAsString());
}

Status EventFileWriter::write_record(std::string_view data) {
  const std::string record = tfrecord(data);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size())
    return Error::at(path_, "cannot write '" + path_ + "': " + std::strerror(errno));
  const std::chrono::duration<double> since = std::chrono::steady_clock::now() - flushed_;
  return since.count() >= flush_interval_s_ ? flush() : Status::success();
}

Status EventFileWriter::flush() {
  if (std::fflush(file_) != 0)
    return Error::at(path_, "cannot write '" + path_ + "': " + std::strerror(errno));
  flushed_ = std::chrono::steady_clock::now();
  return Status::success();
}

}  // namespace loom::observe
