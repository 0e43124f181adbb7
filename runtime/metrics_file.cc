#include "runtime/metrics_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "core/durable_file.h"

namespace loom::runtime {
namespace {

namespace fs = std::filesystem;

Error os_error(const fs::path& file, const std::string& what) {
  return Error::at(file.string(), what + " '" + file.string() + "': " + std::strerror(errno));
}

Result<int> open_for_append(const fs::path& path, int extra_flags) {
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | extra_flags, 0644);
  if (fd < 0) return os_error(path, "cannot write");
  return fd;
}

// Whether a complete row belongs to a step after `step`. Rows that are not a step's JSON object
// are someone else's and stay.
bool after(std::string_view row, int64_t step) {
  const nlohmann::json j = nlohmann::json::parse(row, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return false;
  return j["step"].get<int64_t>() > step;
}

// `text` without the rows after `step` and without a last row that has no newline (a write the
// stopped run did not finish); `dropped` counts them.
std::string rows_through(std::string_view text, int64_t step, int64_t* dropped) {
  std::string kept;
  kept.reserve(text.size());
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) {
      ++*dropped;
      break;
    }
    const std::string_view row = text.substr(begin, end - begin);
    if (after(row, step))
      ++*dropped;
    else
      kept.append(row).push_back('\n');
    begin = end + 1;
  }
  return kept;
}

}  // namespace

Result<std::unique_ptr<MetricsFile>> MetricsFile::create(const fs::path& path) {
  LOOM_ASSIGN_OR_RETURN(int fd, open_for_append(path, O_TRUNC));
  return std::unique_ptr<MetricsFile>(new MetricsFile(fd, path, 0));
}

Result<std::unique_ptr<MetricsFile>> MetricsFile::resume(const fs::path& path, int64_t step) {
  int64_t dropped = 0;
  std::error_code ec;
  // Only a regular file has rows to keep: reading a device such as /dev/full never ends.
  if (fs::is_regular_file(path, ec)) {
    LOOM_ASSIGN_OR_RETURN(std::string text, read_whole_file(path));
    std::string kept = rows_through(text, step, &dropped);
    // Rewritten only when rows go: a reader, or a crash now, sees the old file or the new one.
    if (dropped > 0) LOOM_TRY(write_file_durably(path, kept));
  }
  LOOM_ASSIGN_OR_RETURN(int fd, open_for_append(path, 0));
  return std::unique_ptr<MetricsFile>(new MetricsFile(fd, path, dropped));
}

MetricsFile::~MetricsFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status MetricsFile::append(std::string_view row) {
  std::string line(row);
  line.push_back('\n');
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return os_error(path_, "cannot write");
    done += static_cast<size_t>(n);
  }
  return Status::success();
}

Status MetricsFile::sync() {
  // EINVAL: a special file (/dev/null) that has nothing to sync, not a lost write.
  if (::fsync(fd_) != 0 && errno != EINVAL) return os_error(path_, "cannot write");
  return Status::success();
}

Status MetricsFile::close() {
  const int fd = fd_;
  fd_ = -1;
  // EINVAL: a special file (/dev/null) that has nothing to sync, not a lost write.
  if (::fsync(fd) != 0 && errno != EINVAL) {
    Error e = os_error(path_, "cannot write");
    ::close(fd);
    return e;
  }
  if (::close(fd) != 0) return os_error(path_, "cannot write");
  return Status::success();
}

}  // namespace loom::runtime
