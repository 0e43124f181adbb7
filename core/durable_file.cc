#include "core/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace loom {
namespace {

Error os_error(const std::filesystem::path& path, const std::string& what) {
  return Error::at(path.string(), what + " '" + path.string() + "': " + std::strerror(errno));
}

}  // namespace

Status sync_directory(const std::filesystem::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return os_error(dir, "cannot open directory");
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return os_error(dir, "cannot fsync directory");
  return Status::success();
}

namespace {

// tmp + write (+ fsync) + rename (+ fsync of the directory).
Status write_via_temporary(const std::filesystem::path& path,
                           const std::vector<std::string_view>& parts, const WriteHook& hook,
                           bool sync) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return os_error(tmp, "cannot create");
  size_t total = 0;
  for (std::string_view part : parts) total += part.size();
  // With a hook, the first half is written on its own so a test can stop between the halves.
  const size_t half = hook ? total / 2 : 0;
  size_t done = 0;   // bytes of the file written
  size_t start = 0;  // where the current part begins in the file
  for (std::string_view content : parts) {
    while (done < start + content.size()) {
      const size_t end =
          done < half ? std::min(half, start + content.size()) : start + content.size();
      ssize_t n = ::write(fd, content.data() + (done - start), end - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        Error e = os_error(tmp, "cannot write");
        ::close(fd);
        ::unlink(tmp.c_str());
        return e;
      }
      done += static_cast<size_t>(n);
      if (hook && done == half) hook("half-written");
    }
    start += content.size();
  }
  if (sync && ::fsync(fd) != 0) {
    Error e = os_error(tmp, "cannot fsync");
    ::close(fd);
    ::unlink(tmp.c_str());
    return e;
  }
  ::close(fd);
  if (hook) hook("synced");
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Error e = os_error(path, "cannot rename '" + tmp.string() + "' to");
    ::unlink(tmp.c_str());
    return e;
  }
  if (hook) hook("renamed");
  return sync ? sync_directory(path.parent_path()) : Status::success();
}

}  // namespace

Status write_file_durably(const std::filesystem::path& path, std::string_view content,
                          const WriteHook& hook) {
  return write_via_temporary(path, {content}, hook, /*sync=*/true);
}

Status write_file_durably(const std::filesystem::path& path,
                          const std::vector<std::string_view>& parts, const WriteHook& hook) {
  return write_via_temporary(path, parts, hook, /*sync=*/true);
}

Status write_file_atomically(const std::filesystem::path& path, std::string_view content) {
  return write_via_temporary(path, {content}, {}, /*sync=*/false);
}

Result<std::string> read_whole_file(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return os_error(path, "cannot open");
  std::string bytes;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Error e = os_error(path, "cannot read");
      ::close(fd);
      return e;
    }
    if (n == 0) break;
    if (bytes.empty()) {  // one allocation for the usual case of a regular file
      struct stat st {};
      if (::fstat(fd, &st) == 0 && st.st_size > 0) bytes.reserve(static_cast<size_t>(st.st_size));
    }
    bytes.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return bytes;
}

}  // namespace loom
