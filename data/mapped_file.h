// A file opened read-only, mapped into memory (an index read all over) or not (token ids, read
// with pread: a mapping would be resident far past the bytes read, since current kernels map
// whole page-cache folios around each fault; measured +364 MiB for a 600 MB dataset). Either way
// a rank's resident memory grows with what it reads, not with the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/result.h"

namespace loom::data {

class MappedFile {
 public:
  // Opens `path` and, with `map`, maps it whole; the error names the file. An empty file maps to
  // no bytes.
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path, bool map = true);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // The mapped bytes (null when opened without `map`).
  const uint8_t* bytes() const { return bytes_; }
  // Copies `size` bytes at `offset` into `out` (pread); false when the file is shorter.
  bool read(int64_t offset, int64_t size, uint8_t* out) const;
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // The file's descriptor, for reads that should not pass through the mapping (a scan of every
  // byte that must not leave the whole file resident in this process).
  int fd() const { return fd_; }

 private:
  MappedFile(std::string path, int fd, const uint8_t* bytes, int64_t size)
      : path_(std::move(path)), fd_(fd), bytes_(bytes), size_(size) {}
  std::string path_;
  int fd_;
  const uint8_t* bytes_;
  int64_t size_;
};

}  // namespace loom::data
