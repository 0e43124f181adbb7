#include "checkpoint/reader.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>

#include "checkpoint/crc32.h"
#include "checkpoint/merge.h"
#include "core/check.h"
#include "core/durable_file.h"

namespace loom {

namespace fs = std::filesystem;

namespace {

// As `loom checkpoint inspect` prints a CRC-32, so the two can be compared by eye.
std::string hex32(uint32_t v) {
  char text[9];
  std::snprintf(text, sizeof text, "%08x", v);
  return text;
}

}  // namespace

Result<CheckpointReader> CheckpointReader::open(const fs::path& dir) {
  const fs::path manifest_path = dir / kManifestName;
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) {  // a merged, plan-free checkpoint
    LOOM_ASSIGN_OR_RETURN(std::string bytes, read_whole_file(dir));
    const uint64_t size = bytes.size();
    const uint32_t crc = crc32(bytes);
    LOOM_ASSIGN_OR_RETURN(SafeTensorsFile f,
                          SafeTensorsFile::parse(std::move(bytes), dir.string()));
    LOOM_ASSIGN_OR_RETURN(CheckpointManifest m,
                          merged_manifest(f, dir.filename().string(), size, crc, dir.string()));
    CheckpointReader r;
    r.dir_ = dir.parent_path();
    r.merged_ = true;
    r.manifest_ = std::move(m);
    r.index_slices();
    r.shards_[dir.filename().string()] = std::make_shared<SafeTensorsFile>(std::move(f));
    return r;
  }
  if (!fs::is_directory(dir, ec))
    return Error::at(dir.string(), "checkpoint '" + dir.string() + "' is not a directory");
  if (!fs::exists(manifest_path, ec))
    return Error::at(manifest_path.string(),
                     "checkpoint '" + dir.string() + "' has no " + kManifestName +
                         " (an incomplete checkpoint, or not a loom checkpoint)");
  LOOM_ASSIGN_OR_RETURN(std::string text, read_whole_file(manifest_path));
  LOOM_ASSIGN_OR_RETURN(CheckpointManifest m, parse_manifest(text, manifest_path.string()));
  for (const auto& f : m.files) {
    const fs::path p = dir / f.name;
    const auto size = fs::file_size(p, ec);
    if (ec) return Error::at(p.string(), "checkpoint shard '" + p.string() + "' is missing");
    if (size != f.bytes)
      return Error::at(p.string(), "checkpoint shard '" + p.string() + "' has " +
                                       std::to_string(size) + " bytes but the manifest says " +
                                       std::to_string(f.bytes) + " (truncated?)");
  }
  CheckpointReader r;
  r.dir_ = dir;
  r.manifest_ = std::move(m);
  r.index_slices();
  return r;
}

void CheckpointReader::index_slices() {
  for (size_t i = 0; i < manifest_.slices.size(); ++i) {
    const CheckpointSlice& s = manifest_.slices[i];
    auto& list = slices_[{s.kind, s.tensor}];
    if (list.empty()) names_[s.kind].push_back(s.tensor);
    list.push_back(i);
  }
}

const std::vector<size_t>& CheckpointReader::slices_of(const std::string& tensor,
                                                       const std::string& kind) const {
  static const std::vector<size_t> kNone;
  auto it = slices_.find({kind, tensor});
  return it == slices_.end() ? kNone : it->second;
}

std::vector<std::string> CheckpointReader::tensors(const std::string& kind) const {
  auto it = names_.find(kind);
  return it == names_.end() ? std::vector<std::string>{} : it->second;
}

Result<std::pair<Shape, std::string>> CheckpointReader::describe(const std::string& tensor,
                                                                 const std::string& kind) const {
  const auto& slices = slices_of(tensor, kind);
  if (!slices.empty()) {
    const CheckpointSlice& s = manifest_.slices[slices.front()];
    return std::make_pair(s.global, s.dtype);
  }
  return Error::at(tensor,
                   "checkpoint '" + dir_.string() + "' has no " + kind + " '" + tensor + "'");
}

std::vector<fs::path> CheckpointReader::files() const {
  std::vector<fs::path> out;
  for (const auto& f : manifest_.files) out.push_back(dir_ / f.name);
  if (!merged_) out.push_back(dir_ / kManifestName);
  return out;
}

Result<SafeTensorsFile> CheckpointReader::load_shard(const CheckpointFile& info) const {
  const fs::path p = dir_ / info.name;
  LOOM_ASSIGN_OR_RETURN(std::string bytes, read_whole_file(p));
  if (bytes.size() != info.bytes)
    return Error::at(p.string(), "checkpoint shard '" + p.string() + "' has " +
                                     std::to_string(bytes.size()) +
                                     " bytes but the manifest says " + std::to_string(info.bytes) +
                                     " (truncated?)");
  if (uint32_t crc = crc32(bytes); crc != info.crc32)
    return Error::at(p.string(), "checkpoint shard '" + p.string() + "' is corrupted: CRC-32 " +
                                     hex32(crc) + " but the manifest says " + hex32(info.crc32));
  return SafeTensorsFile::parse(std::move(bytes), p.string());
}

Result<const SafeTensorsFile*> CheckpointReader::shard(const std::string& name) {
  if (auto it = shards_.find(name); it != shards_.end()) return it->second.get();
  const CheckpointFile* info = nullptr;
  for (const auto& f : manifest_.files)
    if (f.name == name) info = &f;
  if (!info) {
    const std::string p = (dir_ / name).string();
    return Error::at(p, "shard '" + p + "' is not listed in the manifest");
  }
  LOOM_ASSIGN_OR_RETURN(SafeTensorsFile f, load_shard(*info));
  auto owned = std::make_shared<SafeTensorsFile>(std::move(f));
  shards_[name] = owned;
  return owned.get();
}

Result<std::string_view> CheckpointReader::slice_bytes(const CheckpointSlice& s,
                                                       const SafeTensorsFile& f) const {
  const SafeTensor* t = f.find(s.key);
  const std::string file = (dir_ / s.file).string();
  if (!t)
    return Error::at(file, "shard '" + file + "' has no tensor '" + s.key + "' for " + s.kind +
                               " '" + s.tensor + "' of checkpoint '" + dir_.string() + "'");
  if (t->dtype != s.dtype || t->shape != s.shape())
    return Error::at(file, "tensor '" + s.key + "' in shard '" + file + "' has shape " +
                               to_string(t->shape) + " " + t->dtype + " but the manifest says " +
                               to_string(s.shape()) + " " + s.dtype);
  return f.data(*t);
}

Status CheckpointReader::verify() const {
  for (const CheckpointFile& info : manifest_.files) {
    // A merged file was parsed when it was opened; a directory's shards are read one by one.
    std::optional<SafeTensorsFile> loaded;
    const SafeTensorsFile* f = nullptr;
    if (auto it = shards_.find(info.name); it != shards_.end()) {
      f = it->second.get();
    } else {
      LOOM_ASSIGN_OR_RETURN(SafeTensorsFile parsed, load_shard(info));
      f = &loaded.emplace(std::move(parsed));
    }
    for (const CheckpointSlice& s : manifest_.slices)
      if (s.file == info.name) LOOM_TRY(slice_bytes(s, *f));
  }
  return Status::success();
}

void copy_overlap(const char* src, const SliceRanges& src_ranges, char* dst,
                  const SliceRanges& dst_ranges, int64_t elem, unsigned char* covered) {
  const size_t nd = dst_ranges.size();
  LOOM_CHECK(src_ranges.size() == nd) << "copy_overlap: ranks differ";
  SliceRanges ov(nd);
  for (size_t d = 0; d < nd; ++d) {
    ov[d] = {std::max(src_ranges[d].first, dst_ranges[d].first),
             std::min(src_ranges[d].second, dst_ranges[d].second)};
    if (ov[d].first >= ov[d].second) return;
  }
  if (nd == 0) {
    std::memcpy(dst, src, static_cast<size_t>(elem));
    if (covered) covered[0] = 1;
    return;
  }
  // Row-major strides (in elements) of both regions.
  std::vector<int64_t> ss(nd, 1), ds(nd, 1);
  for (size_t d = nd - 1; d > 0; --d) {
    ss[d - 1] = ss[d] * (src_ranges[d].second - src_ranges[d].first);
    ds[d - 1] = ds[d] * (dst_ranges[d].second - dst_ranges[d].first);
  }
  const int64_t run = ov[nd - 1].second - ov[nd - 1].first;
  std::vector<int64_t> idx(nd);
  for (size_t d = 0; d < nd; ++d) idx[d] = ov[d].first;
  while (true) {
    int64_t so = 0, doff = 0;
    for (size_t d = 0; d < nd; ++d) {
      so += (idx[d] - src_ranges[d].first) * ss[d];
      doff += (idx[d] - dst_ranges[d].first) * ds[d];
    }
    std::memcpy(dst + doff * elem, src + so * elem, static_cast<size_t>(run * elem));
    if (covered) std::memset(covered + doff, 1, static_cast<size_t>(run));
    // Advance the odometer over every dimension but the last.
    size_t d = nd - 1;
    while (d > 0) {
      --d;
      if (++idx[d] < ov[d].second) break;
      idx[d] = ov[d].first;
      if (d == 0) return;
    }
    if (nd == 1) return;
  }
}

Result<std::string> CheckpointReader::read(const std::string& tensor, const std::string& kind,
                                           const SliceRanges& ranges) {
  LOOM_ASSIGN_OR_RETURN(auto desc, describe(tensor, kind));
  const auto& [global, dtype] = desc;
  const std::string what = kind + " '" + tensor + "' of checkpoint '" + dir_.string() + "'";
  if (global.size() != ranges.size())
    return Error::at(tensor, what + " has shape " + to_string(global) + " but the model's has " +
                                 std::to_string(ranges.size()) + " dimensions");
  int64_t count = 1;
  for (size_t d = 0; d < ranges.size(); ++d) {
    if (ranges[d].first < 0 || ranges[d].first > ranges[d].second || ranges[d].second > global[d])
      return Error::at(tensor, what + " has shape " + to_string(global) +
                                   ", which does not hold the region the model needs");
    count *= ranges[d].second - ranges[d].first;
  }
  const int64_t elem = safetensors_dtype_size(dtype);
  if (elem == 0) return Error::at(tensor, what + " has unknown dtype '" + dtype + "'");
  // The overlapping slices, each checked against its shard (CRC-32, format, key, shape) first.
  std::vector<std::pair<const CheckpointSlice*, std::string_view>> sources;
  uint64_t stored = 0;  // elements those shards really hold: bounds the allocation below
  for (size_t index : slices_of(tensor, kind)) {
    const CheckpointSlice& s = manifest_.slices[index];
    if (s.value_chunks != 1) continue;
    if (s.global != global || s.dtype != dtype)
      return Error::at(tensor,
                       what + " is stored with different shapes or dtypes in different shards");
    bool overlaps = true;
    for (size_t d = 0; d < ranges.size(); ++d)
      overlaps = overlaps && std::max(s.ranges[d].first, ranges[d].first) <
                                 std::min(s.ranges[d].second, ranges[d].second);
    if (!overlaps) continue;
    LOOM_ASSIGN_OR_RETURN(const SafeTensorsFile* f, shard(s.file));
    LOOM_ASSIGN_OR_RETURN(std::string_view data, slice_bytes(s, *f));
    sources.emplace_back(&s, data);
    stored += static_cast<uint64_t>(numel(s.shape()));
  }
  if (static_cast<uint64_t>(count) > stored)
    return Error::at(
        tensor, what + ": only " + std::to_string(stored) + " of the " + std::to_string(count) +
                    " elements needed are stored (a missing shard, or only value-partial pieces)");
  std::string out(static_cast<size_t>(count * elem), '\0');
  std::vector<unsigned char> covered(static_cast<size_t>(count), 0);
  for (const auto& [s, data] : sources)
    copy_overlap(data.data(), s->ranges, out.data(), ranges, elem, covered.data());
  if (std::find(covered.begin(), covered.end(), 0) != covered.end())
    return Error::at(tensor,
                     what +
                         ": part of the region is stored in no shard (a missing shard, or only "
                         "value-partial pieces)");
  return out;
}

std::vector<std::pair<int64_t, fs::path>> complete_checkpoints(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const auto step = parse_checkpoint_dir_name(it->path().filename().string());
    std::error_code exists_ec;
    if (!step || !fs::exists(it->path() / kManifestName, exists_ec)) continue;
    out.emplace_back(*step, it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

fs::path latest_checkpoint(const fs::path& root) {
  auto all = complete_checkpoints(root);
  return all.empty() ? fs::path() : all.back().second;
}

}  // namespace loom
