#include "data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace loom::data {

Result<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path, bool map) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error::at(path, path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error::at(path, path + ": not a regular file");
  }
  const int64_t size = st.st_size;
  const uint8_t* bytes = nullptr;
  if (size > 0 && map) {
    void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return Error::at(path, path + ": cannot map: " + why);
    }
    // Samples are read at scattered offsets: read-ahead past them would only fill memory.
    ::madvise(p, static_cast<size_t>(size), MADV_RANDOM);
    bytes = static_cast<const uint8_t*>(p);
  }
  return std::unique_ptr<MappedFile>(new MappedFile(path, fd, bytes, size));
}

bool MappedFile::read(int64_t offset, int64_t size, uint8_t* out) const {
  while (size > 0) {
    const ssize_t got = ::pread(fd_, out, static_cast<size_t>(size), offset);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    out += got;
    offset += got;
    size -= got;
  }
  return true;
}

MappedFile::~MappedFile() {
  if (bytes_) ::munmap(const_cast<uint8_t*>(bytes_), static_cast<size_t>(size_));
  ::close(fd_);
}

}  // namespace loom::data
