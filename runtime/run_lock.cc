#include "runtime/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace loom::runtime {
namespace {

namespace fs = std::filesystem;

Error os_error(const fs::path& file, const std::string& what) {
  return Error::at(file.string(), what + " '" + file.string() + "': " + std::strerror(errno));
}

// " (pid N)" from the holder's lock file, or "" while it has not written it yet.
std::string holder_of(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "";
  const long pid = std::strtol(buf, nullptr, 10);
  return pid > 0 ? " (pid " + std::to_string(pid) + ")" : "";
}

}  // namespace

Result<std::unique_ptr<RunDirLock>> RunDirLock::acquire(const fs::path& dir,
                                                        const char* file_name) {
  const fs::path file = dir / file_name;
  // Not O_TRUNC: the holder's pid must stay readable by the run that is refused.
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return os_error(file, "cannot create the lock file");
  int rc;
  do rc = ::flock(fd, LOCK_EX | LOCK_NB);
  while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    const std::string holder = err == EWOULDBLOCK ? holder_of(fd) : "";
    ::close(fd);
    errno = err;
    if (err != EWOULDBLOCK) return os_error(file, "cannot lock");
    return Error::at(dir.string(), "'" + dir.string() + "' is in use by another run" + holder +
                                       ", which holds " + file.string() +
                                       ": wait for it to end, or give this run another directory");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    Error e = os_error(file, "cannot write");
    ::close(fd);
    return e;
  }
  return std::unique_ptr<RunDirLock>(new RunDirLock(fd));
}

RunDirLock::~RunDirLock() { ::close(fd_); }

bool holds_run(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "config.yaml", ec) ||
         fs::is_regular_file(dir / "metrics.jsonl", ec);
}

Status clear_run_dir(const fs::path& dir, const std::vector<fs::path>& keep) {
  std::error_code ec;
  auto kept = [&](const fs::path& entry) {
    if (entry.filename() == RunDirLock::kFileName) return true;
    std::error_code same_ec;
    for (const fs::path& k : keep)
      if (fs::equivalent(entry, k, same_ec)) return true;
    return false;
  };
  std::vector<fs::path> entries;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (!kept(it->path())) entries.push_back(it->path());
  if (ec)
    return Error::at(dir.string(),
                     "run.overwrite: cannot list '" + dir.string() + "': " + ec.message());
  for (const fs::path& entry : entries) {
    // A link is removed itself, never what it leads to.
    fs::remove_all(entry, ec);
    if (ec)
      return Error::at(entry.string(),
                       "run.overwrite: cannot remove '" + entry.string() + "': " + ec.message());
  }
  return Status::success();
}

}  // namespace loom::runtime
