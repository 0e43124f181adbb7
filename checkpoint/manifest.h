// A checkpoint's manifest: what a checkpoint holds and where. A checkpoint is a directory
// step_NNNNNNNN/ with one safetensors shard per rank and manifest.json, written last; the
// checkpoint exists only once the manifest does, and the manifest lists every shard file with
// its size and CRC-32 and every stored slice with its FullTensor name, global shape, ranges and
// value chunk. LibTorch-free so any tool (and the fuzzers) can read it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"
#include "core/shape.h"

namespace loom {

constexpr int64_t kCheckpointFormat = 1;
constexpr const char* kManifestName = "manifest.json";

// Kinds of stored tensors.
constexpr const char* kSliceParam = "param";
constexpr const char* kSliceExpAvg = "exp_avg";       // AdamW first moment / SGD momentum
constexpr const char* kSliceExpAvgSq = "exp_avg_sq";  // AdamW second moment
constexpr const char* kSliceRng = "rng";              // a generator state (bytes)

using SliceRanges = std::vector<std::pair<int64_t, int64_t>>;  // [start, end) per dimension

// One stored piece of a tensor: `key` in shard `file`.
struct CheckpointSlice {
  std::string tensor;  // FullTensor name (or generator name for kind rng)
  std::string kind;
  std::string dtype;  // safetensors dtype
  Shape global;       // the FullTensor's shape
  SliceRanges ranges;
  int64_t value_chunk = 0;
  int64_t value_chunks = 1;  // > 1: a partial sum, never read as values
  std::string file;
  std::string key;

  Shape shape() const;
};

struct CheckpointFile {
  std::string name;  // relative to the checkpoint directory
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

struct CheckpointManifest {
  int64_t format = kCheckpointFormat;
  int64_t step = 0;          // optimizer steps taken
  int64_t samples_seen = 0;  // data position: the next sample index
  int64_t world_size = 1;
  std::string plan;  // "dp2 x tp2 x pp1", informational
  int64_t seed = 0;
  int64_t optimizer_steps = 0;
  std::string optimizer;    // adamw | sgd
  std::string config_yaml;  // the resolved config of the run that saved it
  std::vector<CheckpointFile> files;
  std::vector<CheckpointSlice> slices;
};

std::string to_json(const CheckpointManifest& manifest);
// Validates structure and types; errors name `file` and the field or slice.
Result<CheckpointManifest> parse_manifest(std::string_view text, const std::string& file);

// "step_00000005" (at least eight digits).
std::string checkpoint_dir_name(int64_t step);
// The step a checkpoint directory's name stands for, or nothing for any other name.
std::optional<int64_t> parse_checkpoint_dir_name(std::string_view name);

}  // namespace loom
