// Saving and loading training state under any plan. Each rank writes one safetensors shard
// with its parameter and optimizer-state pieces (FullTensor name, global shape, slice, value
// chunk) and its generator state; rank 0 writes the manifest last, once every shard is durable
// (see checkpoint/manifest.h for the layout). Loading reads, for every local piece, the
// overlapping slices of whatever shards exist, so a checkpoint saved under one plan and world
// size loads under any other.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
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
  std::string plan_name;  // "dp2 x tp2 x pp1", recorded in the manifest (informational)
  // Samples per optimizer step (batch.global, from the plan): the data position a checkpoint
  // records and a resume must continue from.
  int64_t global_batch = 0;
};

// The checkpoint checkpoint.resume asks for: an empty path for `none`, and for `latest` when
// no complete checkpoint exists yet; an error naming the key when a given path is not one.
Result<std::filesystem::path> resume_path(const Config& config);

// Saves the state after `step` optimizer steps to <root>/step_<step>. A collective over
// `target.world`. Keeps the newest checkpoint.keep checkpoints, pruning only after the new
// manifest is durable. Errors name the file. A state holding a non-finite value is not written
// (on any rank): the error, keyed kNonFiniteKey (trainer.h), names the first such tensor. Nothing
// is written or deleted through a step_N link leading out of `root` (checkpoint_dir.h).
// snapshot_checkpoint, then write_checkpoint with a barrier over `target.world`.
Status save_checkpoint(const CheckpointTarget& target, const Config& config, int64_t step,
                       const std::filesystem::path& root);

// A checkpoint copied at a step boundary and not yet written: this rank's shard and its part of
// the manifest as host bytes, and on rank 0 the manifest's fields. Writing it reads no tensor, so
// training may go on meanwhile (checkpoint.async).
struct PendingCheckpoint {
  std::filesystem::path root;  // checkpoint.dir
  std::filesystem::path dir;   // root/step_N
  int64_t step = 0;
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t keep = 2;             // checkpoint.keep
  SafeTensorsWriter shard;      // this rank's pieces and generator state
  CheckpointManifest part;      // their slices
  CheckpointManifest manifest;  // rank 0: every field but the files and slices
};

// The part of a save that happens at the step boundary, a collective over `target.world`: every
// rank refuses together when one holds a non-finite value, the step's directory is made (and a
// manifest already there removed, so it stops counting), then each rank copies its state.
// `buffer`: a previous snapshot's shard, whose memory is reused (a fresh buffer of GBs costs
// seconds of page faults).
Result<PendingCheckpoint> snapshot_checkpoint(const CheckpointTarget& target, const Config& config,
                                              int64_t step, const std::filesystem::path& root,
                                              SafeTensorsWriter buffer = {});
// Writes this rank's shard and manifest part durably; then, once `all_written` says every rank's
// are, rank 0 writes the manifest (which makes the checkpoint count) and prunes old ones.
Status write_checkpoint(const PendingCheckpoint& pending,
                        const std::function<Status()>& all_written);
// Rank 0 (others return at once): waits, bounded by `timeout`, until every rank's manifest part
// of `pending` is on disk; the wait of a write on a background thread, which cannot take part in
// the training's collectives. It gives up early once `cancel` is set (the training failed: a
// dead peer's part never comes). An error names the rank whose part is missing.
Status await_checkpoint_parts(const PendingCheckpoint& pending, std::chrono::milliseconds timeout,
                              const std::atomic<bool>& cancel);

// Loads a checkpoint directory into `target`; returns the step it was saved at. Nothing is
// changed unless every tensor loads: errors name the file and tensor.
Result<int64_t> load_checkpoint(const CheckpointTarget& target, const Config& config,
                                const std::filesystem::path& dir);

}  // namespace loom::runtime
