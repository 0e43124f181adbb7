// Reads a checkpoint directory under any plan: any region of any stored tensor is assembled
// from whichever shards overlap it (resharding), after checking each shard file's size and
// CRC-32 against the manifest. LibTorch-free: the runtime wraps the bytes into tensors, and
// `loom checkpoint merge|inspect` and the fuzzers use it directly.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "core/result.h"

namespace loom {

class CheckpointReader {
 public:
  // Reads and validates `dir`/manifest.json; every listed shard must exist with its size.
  // `dir` may also be a merged safetensors file (`loom checkpoint merge`). Errors name the file.
  static Result<CheckpointReader> open(const std::filesystem::path& dir);

  const CheckpointManifest& manifest() const { return manifest_; }
  const std::filesystem::path& dir() const { return dir_; }
  // The files this checkpoint is made of: every shard and manifest.json, or the merged file.
  // A tool writing next to a checkpoint refuses to write over one of them.
  std::vector<std::filesystem::path> files() const;
  // Checks every shard the way read() checks the ones it uses, without assembling anything: size
  // and CRC-32 against the manifest, the safetensors header and offsets, and each slice's key,
  // dtype and shape. Fails naming the file and what is wrong. Holds one shard in memory at a
  // time, so `loom checkpoint inspect` verifies what it lists.
  Status verify() const;
  // Distinct tensor names of a kind, in manifest order.
  std::vector<std::string> tensors(const std::string& kind) const;
  // The global shape and dtype of a stored tensor; an error naming it when absent.
  Result<std::pair<Shape, std::string>> describe(const std::string& tensor,
                                                 const std::string& kind) const;

  // The row-major bytes of region `ranges` of `tensor` (of kind `kind`), assembled from every
  // stored slice that is not a partial sum. Fails naming the tensor and the file when the
  // global shape differs, a shard is corrupt, or part of the region is stored nowhere.
  Result<std::string> read(const std::string& tensor, const std::string& kind,
                           const SliceRanges& ranges);

 private:
  Result<const SafeTensorsFile*> shard(const std::string& name);
  // Shard `info` read whole, checked against the manifest (size, CRC-32) and parsed.
  Result<SafeTensorsFile> load_shard(const CheckpointFile& info) const;
  // The bytes of slice `s` in its shard `f`, once its key, dtype and shape match the manifest.
  Result<std::string_view> slice_bytes(const CheckpointSlice& s, const SafeTensorsFile& f) const;
  void index_slices();  // fills slices_ and names_ from manifest_
  const std::vector<size_t>& slices_of(const std::string& tensor, const std::string& kind) const;

  std::filesystem::path dir_;
  bool merged_ = false;  // opened from a merged file (dir_ is its folder), not a directory
  CheckpointManifest manifest_;
  std::map<std::string, std::shared_ptr<SafeTensorsFile>> shards_;  // verified, by file name
  // Slices of each (kind, tensor), as indices into manifest_.slices, and the tensor names of
  // each kind in manifest order: lookups per tensor instead of scans of every slice.
  std::map<std::pair<std::string, std::string>, std::vector<size_t>> slices_;
  std::map<std::string, std::vector<std::string>> names_;
};

// Complete checkpoints (those with a manifest) under `root`, by step, oldest first.
std::vector<std::pair<int64_t, std::filesystem::path>> complete_checkpoints(
    const std::filesystem::path& root);
// The newest complete checkpoint under `root`; an empty path when there is none.
std::filesystem::path latest_checkpoint(const std::filesystem::path& root);

// Copies the overlap of two row-major regions of one tensor: `src` holds region `src_ranges`,
// `dst` holds region `dst_ranges`; elements are `elem` bytes. Marks copied elements in
// `covered` (one byte per dst element) when it is not null.
void copy_overlap(const char* src, const SliceRanges& src_ranges, char* dst,
                  const SliceRanges& dst_ranges, int64_t elem, unsigned char* covered);

}  // namespace loom
