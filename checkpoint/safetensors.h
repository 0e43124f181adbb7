// The safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}
// and the raw little-endian tensor bytes. loom writes checkpoint shards and merged checkpoints
// in it, so standard tools read them. LibTorch-free so it can be fuzzed under sanitizers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "core/shape.h"

namespace loom {

// Bytes per element of a safetensors dtype ("F32", "I64", "U8", ...); 0 when unknown.
int64_t safetensors_dtype_size(std::string_view dtype);

struct SafeTensor {
  std::string name;
  std::string dtype;
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data section
  uint64_t end = 0;
};

// The header of a file: its tensors (offsets relative to the data section) and metadata. Read
// alone, it lets a reader fetch just the bytes of the tensors or slices it needs: a Hugging
// Face checkpoint of a 70B model is read a slice at a time, never whole.
struct SafeTensorsHeader {
  uint64_t data_start = 0;  // bytes from the file's start to the data section
  std::vector<SafeTensor> tensors;
  std::map<std::string, std::string> metadata;

  // Parses the header at the start of `head` (at least the 8-byte length and the JSON; more is
  // ignored) of a file of `file_size` bytes. Every tensor's offsets lie inside the data section,
  // match its shape and dtype, and no two tensors overlap. Errors name `file` and the tensor or
  // header field.
  static Result<SafeTensorsHeader> parse(std::string_view head, uint64_t file_size,
                                         const std::string& file);
  // Reads and parses only the header of `path`.
  static Result<SafeTensorsHeader> read(const std::filesystem::path& path);
  const SafeTensor* find(const std::string& name) const;
};

// A parsed file; it owns its bytes. Every tensor's offsets lie inside the data section, match
// its shape and dtype, and no two tensors overlap.
class SafeTensorsFile {
 public:
  // Fails, naming `file` and the tensor or header field, on anything malformed.
  static Result<SafeTensorsFile> parse(std::string bytes, const std::string& file);

  const std::vector<SafeTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafeTensor* find(const std::string& name) const;
  std::string_view data(const SafeTensor& t) const;

 private:
  std::string bytes_;
  size_t data_start_ = 0;
  std::vector<SafeTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The start of a file holding `tensors` (their offsets into the data section set) and
// `metadata`: the 8-byte length and the JSON header, padded so the data starts 8-byte aligned.
// A writer streams each tensor's bytes after it, in offset order.
std::string safetensors_header(const std::vector<SafeTensor>& tensors,
                               const std::map<std::string, std::string>& metadata);

// Builds a file in memory: tensors in the order added, contiguous, header padded to 8 bytes.
class SafeTensorsWriter {
 public:
  // `bytes` must hold numel(shape) elements of `dtype`.
  void add(const std::string& name, const std::string& dtype, const Shape& shape,
           std::string_view bytes);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  std::string finish() const;
  // The file as its two parts, header then data, for writing without joining them (a
  // checkpoint shard is GBs).
  std::string header() const { return safetensors_header(tensors_, metadata_); }
  std::string_view data() const { return data_; }
  // Room for `bytes` of tensor data, so that adding them never moves what was added.
  void reserve(size_t bytes) { data_.reserve(bytes); }
  // Empties the writer but keeps its memory, for the next file of the same size.
  void clear() {
    tensors_.clear();
    data_.clear();
    metadata_.clear();
  }

 private:
  std::vector<SafeTensor> tensors_;
  std::string data_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace loom
