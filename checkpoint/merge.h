// One full, plan-free checkpoint out of a sharded one: every tensor assembled whole and written
// as one safetensors file that standard tools read.
#pragma once

#include <string>

#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"
#include "core/result.h"

namespace loom {

// Tensors of the merged file: parameters under their FullTensor names, optimizer state as
// "optimizer.exp_avg.<name>" and "optimizer.exp_avg_sq.<name>". __metadata__ holds
// format = "loom-merged", the step, data position, seed, optimizer and its step count, the
// plan it was saved under and the resolved config. Fails naming the tensor and file when a
// shard is corrupt or a tensor is incomplete.
Result<std::string> merge_checkpoint(CheckpointReader& reader);

// The manifest of a merged file (for resuming from one): one full slice per tensor, in file
// `name` of `bytes` bytes with CRC-32 `crc`. Fails naming the file when it is no merged loom
// checkpoint.
Result<CheckpointManifest> merged_manifest(const SafeTensorsFile& file, const std::string& name,
                                           uint64_t bytes, uint32_t crc, const std::string& path);

// Name of optimizer state `kind` of parameter `name` in a merged file.
std::string merged_name(const std::string& kind, const std::string& name);

}  // namespace loom
