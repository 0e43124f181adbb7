// A Hugging Face model folder as `save_pretrained` writes it: config.json and the weights in
// model.safetensors, or in the shards model.safetensors.index.json lists. Only headers are read
// when the folder is opened; a region of a tensor is then read as the byte ranges that hold it,
// so a rank loading its tensor-parallel slice of a 70B model never holds a full tensor.
// LibTorch-free: the runtime wraps the floats into its parameter pieces.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "core/result.h"
#include "core/shape.h"

namespace loom {

class HfFolder {
 public:
  // Reads config.json and the safetensors headers (every shard the index names). Errors name the
  // folder or file: a missing config.json or weights file, bad JSON, an index naming a tensor its
  // shard lacks, a malformed header.
  static Result<HfFolder> open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path config_file() const { return dir_ / "config.json"; }
  const std::string& config_text() const { return config_text_; }  // config.json as read

  bool contains(const std::string& tensor) const { return tensors_.count(tensor) > 0; }
  // `tensor` as this folder names it: as given, or without the base model's `prefix` (a folder
  // saved from GPT2Model names "wte.weight" what the full model names "transformer.wte.weight");
  // as given when the folder has neither, for the error that follows.
  std::string resolve(const std::string& tensor, const std::string& prefix) const;
  // Every tensor name, sorted.
  std::vector<std::string> tensor_names() const;
  // The file holding `tensor` and its header entry; an error naming the tensor and the folder.
  Result<std::pair<std::filesystem::path, SafeTensor>> find(const std::string& tensor) const;
  // Region `ranges` ([start, end) per dimension) of `tensor`, row-major, converted to float32
  // from F32, BF16 or F16. Reads only the region's bytes. Errors name the tensor and its file.
  Result<std::vector<float>> read(const std::string& tensor, const SliceRanges& ranges) const;
  // Tensor bytes read so far (headers excluded): what a rank's load cost it.
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  struct Entry {
    size_t file = 0;  // index into files_
    SafeTensor tensor;
  };
  struct File {
    std::filesystem::path path;
    uint64_t data_start = 0;
  };
  std::filesystem::path dir_;
  std::string config_text_;
  std::vector<File> files_;
  std::map<std::string, Entry> tensors_;
  mutable uint64_t bytes_read_ = 0;
};

// IEEE half and bfloat16 bit patterns to float.
float half_to_float(uint16_t bits);
float bfloat16_to_float(uint16_t bits);

}  // namespace loom
