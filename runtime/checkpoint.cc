#include "runtime/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include "checkpoint/crc32.h"
#include "checkpoint/flat_range.h"
#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"
#include "comm/comm.h"
#include "core/durable_file.h"
#include "runtime/debug_env.h"
#include "runtime/device.h"
#include "runtime/optimizer.h"
#include "runtime/trainer.h"

namespace loom::runtime {

namespace fs = std::filesystem;

namespace {

// LOOM_DEBUG_CKPT_CRASH_AT: counts the points of checkpoint writing in this process (on the
// training thread and on checkpoint.async's writer alike).
void crash_point() {
  static std::atomic<int64_t> count{0};
  static const int64_t at = debug_env_int("LOOM_DEBUG_CKPT_CRASH_AT", -1);
  if (++count == at) raise(SIGKILL);
}

const WriteHook& crash_hook() {
  static const WriteHook hook = [](const char*) { crash_point(); };
  return hook;
}

std::string rank_name(int64_t rank, const char* ext) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "rank_%05lld.%s", static_cast<long long>(rank), ext);
  return buf;
}

SliceRanges ranges_of(const graph::SubTensor& piece) {
  SliceRanges r;
  for (const auto& range : piece.ranges) r.emplace_back(range.start, range.end);
  return r;
}

int64_t region_numel(const SliceRanges& ranges) {
  int64_t n = 1;
  for (const auto& [b, e] : ranges) n *= e - b;
  return n;
}

std::string ranges_string(const SliceRanges& ranges) {
  std::string s = "[";
  for (size_t d = 0; d < ranges.size(); ++d)
    s += (d ? "," : "") + std::to_string(ranges[d].first) + ":" + std::to_string(ranges[d].second);
  return s + "]";
}

// The global regions `value` (what is stored for `piece`) covers, each with its offset in
// `value`'s elements: the piece, or for optimizer state of part of it (parallel.zero 1: the
// elements `optimizer->owned()` names) the boxes of that run of elements.
std::vector<std::pair<SliceRanges, int64_t>> stored_regions(const CheckpointTarget& t,
                                                            const graph::SubTensor& piece,
                                                            const at::Tensor& value, size_t i) {
  const SliceRanges whole = ranges_of(piece);
  if (value.numel() == numel(piece.shape())) return {{whole, 0}};
  LOOM_CHECK(t.optimizer != nullptr) << "a stored tensor smaller than its piece";
  const auto [begin, end] = t.optimizer->owned()[i];
  std::vector<std::pair<SliceRanges, int64_t>> out;
  for (const FlatBox& box : flat_range_boxes(piece.shape(), begin, end)) {
    SliceRanges global = box.ranges;
    for (size_t d = 0; d < global.size(); ++d) {
      global[d].first += whole[d].first;
      global[d].second += whole[d].first;
    }
    out.emplace_back(std::move(global), box.offset - begin);
  }
  return out;
}

std::string_view bytes_of(const at::Tensor& t) {
  return {static_cast<const char*>(t.data_ptr()),
          static_cast<size_t>(t.numel() * t.element_size())};
}

Status barrier(const CheckpointTarget& t, const char* what) {
  if (!t.world) return Status::success();
  Status s = t.world->barrier();
  if (!s.ok())
    return Error::at("comm", std::string("checkpoint ") + what + ": " + s.error().message);
  return s;
}

std::vector<std::pair<const char*, const std::vector<at::Tensor>*>> stored_kinds(
    const CheckpointTarget& t) {
  std::vector<std::pair<const char*, const std::vector<at::Tensor>*>> kinds = {
      {kSliceParam, &t.params}};
  if (t.optimizer) {
    kinds.emplace_back(kSliceExpAvg, &t.optimizer->exp_avg());
    if (!t.optimizer->exp_avg_sq().empty())
      kinds.emplace_back(kSliceExpAvgSq, &t.optimizer->exp_avg_sq());
  }
  return kinds;
}

// Removes all but the newest `keep` complete checkpoints, and incomplete ones older than the
// newest: a checkpoint's manifest goes first, so it is never seen complete and half-deleted.
Status prune(const fs::path& root, int64_t keep, int64_t newest) {
  auto complete = complete_checkpoints(root);
  std::error_code ec;
  for (size_t i = 0; i + static_cast<size_t>(keep) < complete.size(); ++i) {
    LOOM_TRY(check_inside(root, complete[i].second));
    crash_point();
    fs::remove(complete[i].second / kManifestName, ec);
    LOOM_TRY(sync_directory(complete[i].second));
    fs::remove_all(complete[i].second, ec);
  }
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    // Unfinished checkpoints older than the newest complete one: a writer died in them.
    const auto step = parse_checkpoint_dir_name(it->path().filename().string());
    std::error_code exists_ec;
    if (!step || fs::exists(it->path() / kManifestName, exists_ec)) continue;
    if (*step >= newest) continue;
    LOOM_TRY(check_inside(root, it->path()));
    fs::remove_all(it->path(), ec);
  }
  return sync_directory(root);
}

// The first stored tensor of this rank holding a non-finite value ("" when none): one host read
// for them all, then a search only when one is found. A tensor is finite when its sum in double
// is: a NaN or an infinity carries into the sum, and float32 values cannot overflow it. One pass
// per tensor, with no temporary of its size (an isfinite mask of a GB of state is a quarter GB).
std::string first_non_finite(const CheckpointTarget& t) {
  std::vector<at::Tensor> sums;
  std::vector<std::string> names;
  for (const auto& [kind, tensors] : stored_kinds(t))
    for (size_t i = 0; i < t.pieces.size(); ++i) {
      if (!(*tensors)[i].defined()) continue;
      sums.push_back((*tensors)[i].detach().sum(at::kDouble).reshape({1}));
      names.push_back(std::string(kind) + " '" + t.graph->tensor(t.pieces[i].tensor).name + "'");
    }
  if (sums.empty()) return "";
  const at::Tensor finite = at::isfinite(at::cat(sums)).cpu();
  const bool* ok = finite.data_ptr<bool>();
  for (size_t i = 0; i < names.size(); ++i)
    if (!ok[i]) return names[i];
  return "";
}

// Every rank refuses together when any rank's state holds a non-finite value.
Status check_finite(const CheckpointTarget& t, int64_t step) {
  const std::string bad = first_non_finite(t);
  const at::Device device = t.params.empty() ? at::Device(at::kCPU) : t.params[0].device();
  at::Tensor count =
      at::full({1}, bad.empty() ? 0.0 : 1.0, at::TensorOptions().dtype(at::kDouble).device(device));
  if (t.world && t.world->size() > 1) {
    if (Status s = t.world->all_reduce(count); !s.ok())
      return Error::at("comm", "checkpoint: " + s.error().message);
  }
  if (count.cpu().item<double>() == 0) return Status::success();
  return Error::at(kNonFiniteKey,
                   "the state after step " + std::to_string(step) + " holds a non-finite value (" +
                       (bad.empty() ? std::string("on another rank")
                                    : bad + " on rank " + std::to_string(t.rank)) +
                       "): its checkpoint is not written, the last one written is the last good "
                       "state");
}

}  // namespace

Result<fs::path> resume_path(const Config& config) {
  const std::string& r = config.checkpoint.resume;
  if (r == "none") return fs::path();
  if (r == "latest") return latest_checkpoint(checkpoint_root(config));
  std::error_code ec;
  if (fs::is_regular_file(r, ec)) return fs::path(r);  // a merged checkpoint
  if (!fs::is_directory(r, ec))
    return config.error(
        "checkpoint.resume",
        "checkpoint.resume: '" + r +
            "' is not a checkpoint (use none, latest, a step_N directory, a checkpoint "
            "root, or a merged .safetensors file)");
  // The root of a run's checkpoints resumes from its newest.
  if (!fs::exists(fs::path(r) / kManifestName, ec)) {
    fs::path latest = latest_checkpoint(r);
    if (!latest.empty()) return latest;
  }
  return fs::path(r);
}

namespace {

// This rank's shard (every piece it stores, and its generator state) and its part of the
// manifest, copied into `p`. On a GPU the pieces go to pinned host memory first, all copies
// queued before one wait.
void snapshot_shard(const CheckpointTarget& t, PendingCheckpoint& p) {
  const std::string shard_name = rank_name(t.rank, "safetensors");
  std::vector<at::Tensor> host;  // per stored tensor, in stored_kinds' order
  size_t bytes = 0;
  for (const auto& [kind, tensors] : stored_kinds(t))
    for (const at::Tensor& value : *tensors)
      if (value.defined()) bytes += static_cast<size_t>(value.numel()) * sizeof(float);
  // The generator's state, a few KiB, follows; reserved whole so that no add moves the buffer.
  p.shard.reserve(bytes + 65536);
  std::optional<at::Device> queued;  // the GPU the copies were queued on
  for (const auto& [kind, tensors] : stored_kinds(t))
    for (const at::Tensor& value : *tensors) {
      if (!value.defined()) {
        host.emplace_back();
        continue;
      }
      at::Tensor v = value.detach();
      if (v.is_cuda()) {
        at::Tensor pinned = at::empty(
            v.sizes(), at::TensorOptions().dtype(at::kFloat).device(at::kCPU).pinned_memory(true));
        pinned.copy_(v, /*non_blocking=*/true);
        host.push_back(pinned);
        queued = v.device();
      } else {
        host.push_back(v.to(at::kFloat).contiguous());
      }
    }
  if (queued) synchronize_device(RunDevice{*queued});
  size_t next = 0;
  for (const auto& [kind, tensors] : stored_kinds(t)) {
    for (size_t i = 0; i < t.pieces.size(); ++i) {
      const at::Tensor& value = host[next++];
      // Optimizer state of elements other ranks own (parallel.zero 1): its owners write it.
      if (!value.defined()) continue;
      const graph::SubTensor& piece = t.pieces[i];
      const graph::FullTensor& full = t.graph->tensor(piece.tensor);
      for (const auto& [ranges, offset] : stored_regions(t, piece, (*tensors)[i], i)) {
        at::Tensor region = value.view({-1}).narrow(0, offset, region_numel(ranges));
        CheckpointSlice s{full.name,          kind,       "F32",
                          full.shape,         ranges,     piece.value_chunk,
                          piece.value_chunks, shard_name, ""};
        s.key = std::string(kind) + "/" + full.name + "/" + ranges_string(ranges);
        p.shard.add(s.key, "F32", s.shape(), bytes_of(region));
        p.part.slices.push_back(std::move(s));
      }
    }
  }
  // The generator state, so a run that draws random numbers after initialisation resumes them.
  at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  const std::string rng_name = "cpu_generator/rank_" + std::to_string(t.rank);
  p.shard.add(std::string(kSliceRng) + "/" + rng_name, "U8", {rng.numel()}, bytes_of(rng));
  p.part.slices.push_back({rng_name,
                           kSliceRng,
                           "U8",
                           {rng.numel()},
                           {{0, rng.numel()}},
                           0,
                           1,
                           shard_name,
                           std::string(kSliceRng) + "/" + rng_name});
}

// The manifest's fields other than its files and slices, which rank 0 gathers from the parts.
CheckpointManifest manifest_fields(const CheckpointTarget& t, const Config& config, int64_t step) {
  CheckpointManifest m;
  m.step = step;
  m.samples_seen = step * t.global_batch;
  m.world_size = t.world_size;
  m.plan = t.plan_name;
  m.seed = config.run.seed;
  m.optimizer_steps = t.optimizer ? t.optimizer->steps_taken() : 0;
  m.optimizer = t.optimizer ? std::string(name(t.optimizer->kind())) : std::string();
  m.config_yaml = to_yaml(config);
  return m;
}

// This rank's shard, then its part of the manifest, written durably: a part on disk says its
// shard is durable.
Status write_shard(const PendingCheckpoint& p) {
  const std::string shard_name = rank_name(p.rank, "safetensors");
  const std::string header = p.shard.header();
  const std::string_view data = p.shard.data();
  CheckpointManifest part = p.part;
  part.files.push_back({shard_name, header.size() + data.size(), crc32(data, crc32(header))});
  LOOM_TRY(write_file_durably(p.dir / shard_name, {header, data}, crash_hook()));
  LOOM_TRY(write_file_durably(p.dir / rank_name(p.rank, "json"), to_json(part), crash_hook()));
  return Status::success();
}

// Rank 0, once every shard is durable: the manifest of all ranks' parts, which makes the
// checkpoint count.
Status write_manifest(const PendingCheckpoint& p) {
  CheckpointManifest m = p.manifest;
  for (int64_t r = 0; r < p.world_size; ++r) {
    const fs::path path = p.dir / rank_name(r, "json");
    LOOM_ASSIGN_OR_RETURN(std::string text, read_whole_file(path));
    LOOM_ASSIGN_OR_RETURN(CheckpointManifest rp, parse_manifest(text, path.string()));
    m.files.insert(m.files.end(), rp.files.begin(), rp.files.end());
    m.slices.insert(m.slices.end(), rp.slices.begin(), rp.slices.end());
  }
  LOOM_TRY(write_file_durably(p.dir / kManifestName, to_json(m), crash_hook()));
  return Status::success();
}

// Whether the checkpoint read by `reader` is this model's and continues this run: the same
// parameters and shapes, batch size, seed and optimizer.
Status check_resumable(CheckpointReader& reader, const CheckpointTarget& t, const Config& config,
                       const std::string& where) {
  const CheckpointManifest& m = reader.manifest();
  // The model and the checkpoint must hold the same parameters with the same shapes.
  std::vector<std::string> stored = reader.tensors(kSliceParam);
  for (const auto& full : t.graph->tensors()) {
    if (full.role != graph::TensorRole::kParameter) continue;
    auto d = reader.describe(full.name, kSliceParam);
    if (!d.ok())
      return Error::at(
          full.name, where + " has no parameter '" + full.name + "' of the model (another model?)");
    if (d->first != full.shape)
      return Error::at(full.name, where + ": parameter '" + full.name + "' has shape " +
                                      to_string(d->first) + " but the model's is " +
                                      to_string(full.shape));
  }
  for (const auto& name : stored)
    if (!t.graph->find_tensor(name))
      return Error::at(name, where + " holds parameter '" + name +
                                 "', which the model does not have (another model?)");
  // The trainer reads sample step * batch.global next: another batch size would skip or repeat
  // data.
  if (m.samples_seen != m.step * t.global_batch)
    return config.error(
        "batch.global",
        where + " was saved after " + std::to_string(m.samples_seen) + " samples at step " +
            std::to_string(m.step) + "; batch.global " + std::to_string(t.global_batch) +
            " would resume at another data position (use the batch.global it was saved with)");
  // The seed orders the data (data.seed -1 follows it): another one would not continue the run.
  if (m.seed != config.run.seed)
    return config.error("run.seed", where + " was saved by a run with run.seed " +
                                        std::to_string(m.seed) + "; run.seed " +
                                        std::to_string(config.run.seed) +
                                        " would continue it with another data order (resume "
                                        "with run.seed=" +
                                        std::to_string(m.seed) + ")");
  const bool with_optimizer = t.optimizer != nullptr;
  const std::string optimizer = with_optimizer ? std::string(name(t.optimizer->kind())) : "";
  if (with_optimizer && m.optimizer != optimizer)
    return config.error("optimizer.type", where + " was saved with optimizer " + m.optimizer +
                                              ", but optimizer.type is " + optimizer);

  return Status::success();
}

// Every stored piece of `kinds`, read before anything is changed (undefined: state of a piece
// another rank owns).
Result<std::vector<std::vector<at::Tensor>>> read_pieces(
    CheckpointReader& reader, const CheckpointTarget& t,
    const std::vector<std::pair<const char*, const std::vector<at::Tensor>*>>& kinds) {
  // Read everything before changing anything.
  std::vector<std::vector<at::Tensor>> loaded;
  for (const auto& [kind, tensors] : kinds) {
    std::vector<at::Tensor> values;
    for (size_t i = 0; i < t.pieces.size(); ++i) {
      if (!(*tensors)[i].defined()) {  // state of a piece another rank owns
        values.emplace_back();
        continue;
      }
      const graph::SubTensor& piece = t.pieces[i];
      const graph::FullTensor& full = t.graph->tensor(piece.tensor);
      if (piece.is_partial())
        return Error::at(full.name, "cannot load parameter '" + full.name +
                                        "': this plan holds it as value chunk " +
                                        std::to_string(piece.value_chunk) + " of " +
                                        std::to_string(piece.value_chunks));
      at::Tensor v = at::empty((*tensors)[i].sizes(), at::kFloat);
      for (const auto& [ranges, offset] : stored_regions(t, piece, (*tensors)[i], i)) {
        LOOM_ASSIGN_OR_RETURN(std::string bytes, reader.read(full.name, kind, ranges));
        LOOM_CHECK(static_cast<size_t>(region_numel(ranges) * 4) == bytes.size())
            << "region size of " << full.name;
        std::memcpy(static_cast<char*>(v.data_ptr()) + offset * 4, bytes.data(), bytes.size());
      }
      values.push_back(v);
    }
    loaded.push_back(std::move(values));
  }
  return loaded;
}

// The generator state to resume: this rank's when the world is the same, else rank 0's;
// undefined when the checkpoint has none. Checked on a scratch generator.
Result<at::Tensor> read_generator(CheckpointReader& reader, const CheckpointTarget& t,
                                  const std::string& where) {
  const CheckpointManifest& m = reader.manifest();
  const int64_t rng_rank = m.world_size == t.world_size ? t.rank : 0;
  const std::string rng_name = "cpu_generator/rank_" + std::to_string(rng_rank);
  at::Tensor rng;
  if (auto d = reader.describe(rng_name, kSliceRng); d.ok() && d->first.size() == 1) {
    LOOM_ASSIGN_OR_RETURN(std::string bytes, reader.read(rng_name, kSliceRng, {{0, d->first[0]}}));
    rng = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
    std::memcpy(rng.data_ptr(), bytes.data(), bytes.size());
    try {  // validated on a scratch generator, so a bad state changes nothing
      at::Generator scratch = at::make_generator<at::CPUGeneratorImpl>();
      scratch.set_state(rng);
    } catch (const std::exception&) {
      return Error::at(rng_name, where + ": generator state '" + rng_name + "' is not valid");
    }
  }

  return rng;
}

}  // namespace

Result<PendingCheckpoint> snapshot_checkpoint(const CheckpointTarget& t, const Config& config,
                                              int64_t step, const fs::path& root,
                                              SafeTensorsWriter buffer) {
  PendingCheckpoint p;
  p.shard = std::move(buffer);
  p.shard.clear();
  p.root = root;
  p.dir = root / checkpoint_dir_name(step);
  p.step = step;
  p.rank = t.rank;
  p.world_size = t.world_size;
  p.keep = config.checkpoint.keep;
  LOOM_TRY(check_finite(t, step));
  LOOM_TRY(check_inside(root, p.dir));
  std::error_code ec;
  fs::create_directories(p.dir, ec);
  if (ec)
    return Error::at("checkpoint.dir",
                     "checkpoint.dir: cannot create '" + p.dir.string() + "': " + ec.message());
  // A part left by an earlier attempt at this step would pass for this one's.
  fs::remove(p.dir / rank_name(t.rank, "json"), ec);
  if (t.rank == 0) {
    // Saving again at a step that has a checkpoint: it stops counting before any shard changes.
    if (fs::exists(p.dir / kManifestName)) {
      crash_point();
      fs::remove(p.dir / kManifestName, ec);
      LOOM_TRY(sync_directory(p.dir));
    }
    LOOM_TRY(sync_directory(p.root));
    p.manifest = manifest_fields(t, config, step);
  }
  LOOM_TRY(barrier(t, "start"));
  snapshot_shard(t, p);
  return p;
}

Status write_checkpoint(const PendingCheckpoint& p, const std::function<Status()>& all_written) {
  LOOM_TRY(write_shard(p));
  LOOM_TRY(all_written());
  if (p.rank != 0) return Status::success();
  LOOM_TRY(write_manifest(p));
  return prune(p.root, p.keep, p.step);
}

Status await_checkpoint_parts(const PendingCheckpoint& p, std::chrono::milliseconds timeout,
                              const std::atomic<bool>& cancel) {
  if (p.rank != 0) return Status::success();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::chrono::milliseconds pause{1};
  for (int64_t r = 1; r < p.world_size; ++r) {
    std::error_code ec;
    while (!fs::exists(p.dir / rank_name(r, "json"), ec)) {
      if (cancel.load())
        return Error::at("checkpoint.async",
                         "checkpoint '" + p.dir.string() + "': the training failed before rank " +
                             std::to_string(r) +
                             "'s shard was written; the previous checkpoint stays the latest");
      if (std::chrono::steady_clock::now() >= deadline)
        return Error::at("comm.timeout_s", "checkpoint '" + p.dir.string() + "': rank " +
                                               std::to_string(r) +
                                               "'s shard was not written within comm.timeout_s (" +
                                               std::to_string(timeout.count() / 1000) +
                                               " s); the previous checkpoint stays the latest");
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  }
  return Status::success();
}

Status save_checkpoint(const CheckpointTarget& t, const Config& config, int64_t step,
                       const fs::path& root) {
  LOOM_ASSIGN_OR_RETURN(PendingCheckpoint p, snapshot_checkpoint(t, config, step, root));
  return write_checkpoint(p, [&] { return barrier(t, "shards written"); });
}

Result<int64_t> load_checkpoint(const CheckpointTarget& t, const Config& config,
                                const fs::path& dir) {
  LOOM_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::open(dir));
  const CheckpointManifest& m = reader.manifest();
  const std::string where = "checkpoint '" + dir.string() + "'";
  LOOM_TRY(check_resumable(reader, t, config, where));
  auto kinds = stored_kinds(t);
  LOOM_ASSIGN_OR_RETURN(auto loaded, read_pieces(reader, t, kinds));
  LOOM_ASSIGN_OR_RETURN(at::Tensor rng, read_generator(reader, t, where));
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < kinds.size(); ++k)
    for (size_t i = 0; i < t.pieces.size(); ++i)
      if (loaded[k][i].defined()) (*kinds[k].second)[i].detach().copy_(loaded[k][i]);
  if (t.optimizer) t.optimizer->set_steps_taken(m.optimizer_steps);
  if (rng.defined()) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(rng);
  }
  return m.step;
}

}  // namespace loom::runtime
