// Saving and loading training state under any plan. Each rank writes one safetensors shard
// with its parameter and optimizer-state pieces (FullTensor name, global shape, slice, value
// chunk) and its generator state; rank 0 writes the manifest last, once every shard is durable
// (see checkpoint/manifest.h for the layout). Loading reads, for every local piece, the
// overlapping slices of whatever shards exist, so a checkpoint saved under one plan and world
// size loads under any other.
#pragma once

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <vector>

#include "core/config.h"
#include "core/result.h"
#include "graph/graph.h"
#include "runtime/checkpoint_dir.h"

namespace loom::comm {
class Comm;
}  // namespace loom::comm

namespace loom::runtime {

class Optimizer;

// What one rank saves and loads.
struct CheckpointTarget {
  const graph::Graph* graph = nullptr;   // names and shapes of the FullTensors
  std::vector<graph::SubTensor> pieces;  // this rank's parameter pieces
  std::vector<at::Tensor> params;        // their values, as pieces
  Optimizer* optimizer = nullptr;        // its state follows `params`
  comm::Comm* world = nullptr;           // null in single-process runs
  int64_t rank = 0;
  int64_t world_size = 1;
};

// The checkpoint checkpoint.resume asks for: an empty path for `none`, and for `latest` when
// no complete checkpoint exists yet; an error naming the key when a given path is not one.
Result<std::filesystem::path> resume_path(const Config& config);

// Saves the state after `step` optimizer steps to <root>/step_<step>. A collective over
// `target.world`. Keeps the newest checkpoint.keep checkpoints, pruning only after the new
// manifest is durable. Errors name the file. A state holding a non-finite value is not written
// (on any rank): the error, keyed kNonFiniteKey (trainer.h), names the first such tensor. Nothing
// is written or deleted through a step_N link leading out of `root` (checkpoint_dir.h).
Status save_checkpoint(const CheckpointTarget& target, const Config& config, int64_t step,
                       const std::filesystem::path& root);

// Loads a checkpoint directory into `target`; returns the step it was saved at. Nothing is
// changed unless every tensor loads: errors name the file and tensor.
Result<int64_t> load_checkpoint(const CheckpointTarget& target, const Config& config,
                                const std::filesystem::path& dir);

}  // namespace loom::runtime
