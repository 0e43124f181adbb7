// A file mapped read-only into memory: a reader touches only the pages it reads, so a rank's
// resident memory grows with the samples it consumes, not with the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/result.h"

namespace loom::data {

class MappedFile {
 public:
  // Maps `path` whole; the error names the file. An empty file maps to no bytes.
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* bytes() const { return bytes_; }
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
