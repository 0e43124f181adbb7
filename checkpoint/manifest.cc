#include "checkpoint/manifest.h"

#include <cstdio>
#include <nlohmann/json.hpp>

namespace loom {
namespace {

using nlohmann::json;

Error bad(const std::string& file, const std::string& what) {
  return Error::at(file, "'" + file + "' is not a valid loom checkpoint manifest: " + what);
}

bool is_int(const json& j, const char* key) {
  return j.contains(key) && j[key].is_number_integer();
}
bool is_str(const json& j, const char* key) { return j.contains(key) && j[key].is_string(); }

}  // namespace

Shape CheckpointSlice::shape() const {
  Shape s;
  for (const auto& [b, e] : ranges) s.push_back(e - b);
  return s;
}

std::optional<int64_t> parse_checkpoint_dir_name(std::string_view name) {
  constexpr std::string_view kPrefix = "step_";
  if (name.size() < kPrefix.size() + 8 || name.size() > kPrefix.size() + 18 ||
      name.substr(0, 5) != kPrefix)
    return std::nullopt;
  int64_t step = 0;
  for (char c : name.substr(kPrefix.size())) {
    if (c < '0' || c > '9') return std::nullopt;
    step = step * 10 + (c - '0');
  }
  return step;
}

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string to_json(const CheckpointManifest& m) {
  json files = json::array();
  for (const auto& f : m.files)
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"crc32", f.crc32}});
  json slices = json::array();
  for (const auto& s : m.slices) {
    json ranges = json::array();
    for (const auto& [b, e] : s.ranges) ranges.push_back({b, e});
    slices.push_back({{"tensor", s.tensor},
                      {"kind", s.kind},
                      {"dtype", s.dtype},
                      {"global", s.global},
                      {"ranges", ranges},
                      {"value_chunk", s.value_chunk},
                      {"value_chunks", s.value_chunks},
                      {"file", s.file},
                      {"key", s.key}});
  }
  json j = {{"format", m.format},
            {"step", m.step},
            {"samples_seen", m.samples_seen},
            {"world_size", m.world_size},
            {"plan", m.plan},
            {"seed", m.seed},
            {"optimizer_steps", m.optimizer_steps},
            {"optimizer", m.optimizer},
            {"config", m.config_yaml},
            {"files", files},
            {"slices", slices}};
  return j.dump(1);
}

namespace {

// The run's fields: format, step, world size, seed, plan, optimizer and config.
Status parse_header(const json& j, const std::string& file, CheckpointManifest& m) {
  for (const char* key :
       {"format", "step", "samples_seen", "world_size", "seed", "optimizer_steps"})
    if (!is_int(j, key))
      return bad(file, std::string("'") + key + "' is missing or not an integer");
  for (const char* key : {"plan", "optimizer", "config"})
    if (!is_str(j, key)) return bad(file, std::string("'") + key + "' is missing or not a string");
  m.format = j["format"].get<int64_t>();
  if (m.format != kCheckpointFormat)
    return bad(file, "format " + std::to_string(m.format) + " (this loom reads format " +
                         std::to_string(kCheckpointFormat) + ")");
  m.step = j["step"].get<int64_t>();
  m.samples_seen = j["samples_seen"].get<int64_t>();
  m.world_size = j["world_size"].get<int64_t>();
  m.seed = j["seed"].get<int64_t>();
  m.optimizer_steps = j["optimizer_steps"].get<int64_t>();
  m.plan = j["plan"].get<std::string>();
  m.optimizer = j["optimizer"].get<std::string>();
  m.config_yaml = j["config"].get<std::string>();
  if (m.step < 0 || m.world_size < 1) return bad(file, "negative step or world_size < 1");
  return Status::success();
}

// The shard files with their sizes and checksums: plain names in the checkpoint directory.
Status parse_files(const json& j, const std::string& file, CheckpointManifest& m) {
  if (!j.contains("files") || !j["files"].is_array()) return bad(file, "'files' is missing");
  for (const json& f : j["files"]) {
    if (!f.is_object() || !is_str(f, "name") || !f.contains("bytes") ||
        !f["bytes"].is_number_unsigned() || !f.contains("crc32") ||
        !f["crc32"].is_number_unsigned() || f["crc32"].get<uint64_t>() > 0xFFFFFFFFull)
      return bad(file, "an entry of 'files' needs name, bytes and crc32");
    CheckpointFile cf{f["name"].get<std::string>(), f["bytes"].get<uint64_t>(),
                      static_cast<uint32_t>(f["crc32"].get<uint64_t>())};
    if (cf.name.empty() || cf.name.find('/') != std::string::npos || cf.name[0] == '.')
      return bad(file,
                 "file name '" + cf.name + "' is not a plain name in the checkpoint directory");
    m.files.push_back(std::move(cf));
  }
  return Status::success();
}

// A slice's global shape and its [start, end) range per dimension, inside the shape and of a
// bounded element count. `where` starts each message.
Status parse_slice_shape(const json& s, const std::string& file, const std::string& where,
                         CheckpointSlice& c) {
  if (!s.contains("global") || !s["global"].is_array() || !s.contains("ranges") ||
      !s["ranges"].is_array() || s["global"].size() != s["ranges"].size() ||
      s["global"].size() > 16)
    return bad(file, where + "global shape and ranges must be arrays of the same length");
  for (size_t d = 0; d < s["global"].size(); ++d) {
    const json& g = s["global"][d];
    const json& r = s["ranges"][d];
    if (!g.is_number_integer() || !r.is_array() || r.size() != 2 || !r[0].is_number_integer() ||
        !r[1].is_number_integer())
      return bad(file, where + "dimension " + std::to_string(d) +
                           " is not an integer with a [start, end) range");
    const int64_t dim = g.get<int64_t>(), b = r[0].get<int64_t>(), e = r[1].get<int64_t>();
    if (dim < 0 || b < 0 || b > e || e > dim)
      return bad(file, where + "range [" + std::to_string(b) + ", " + std::to_string(e) +
                           ") of dimension " + std::to_string(d) + " lies outside its size " +
                           std::to_string(dim));
    c.global.push_back(dim);
    c.ranges.emplace_back(b, e);
  }
  int64_t count = 1;
  for (int64_t dim : c.global)
    if (__builtin_mul_overflow(count, dim, &count) || count > (int64_t{1} << 56))
      return bad(file, where + "global shape " + to_string(c.global) + " is too large");
  return Status::success();
}

// One entry of 'slices': a tensor's piece, its value chunk, shape and the listed file holding it.
Result<CheckpointSlice> parse_slice(const json& s, const std::string& file,
                                    const CheckpointManifest& m) {
  if (!s.is_object()) return bad(file, "a slice is not an object");
  for (const char* key : {"tensor", "kind", "dtype", "file", "key"})
    if (!is_str(s, key)) return bad(file, std::string("a slice has no string '") + key + "'");
  CheckpointSlice c;
  c.tensor = s["tensor"].get<std::string>();
  const std::string where = "slice of '" + c.tensor + "': ";
  c.kind = s["kind"].get<std::string>();
  c.dtype = s["dtype"].get<std::string>();
  c.file = s["file"].get<std::string>();
  c.key = s["key"].get<std::string>();
  if (!is_int(s, "value_chunk") || !is_int(s, "value_chunks"))
    return bad(file, where + "no value chunk");
  c.value_chunk = s["value_chunk"].get<int64_t>();
  c.value_chunks = s["value_chunks"].get<int64_t>();
  if (c.value_chunks < 1 || c.value_chunk < 0 || c.value_chunk >= c.value_chunks)
    return bad(file, where + "value chunk out of range");
  LOOM_TRY(parse_slice_shape(s, file, where, c));
  bool listed = false;
  for (const auto& f : m.files) listed = listed || f.name == c.file;
  if (!listed) return bad(file, where + "its file '" + c.file + "' is not in 'files'");
  return c;
}

}  // namespace

Result<CheckpointManifest> parse_manifest(std::string_view text, const std::string& file) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return bad(file, "not a JSON object (truncated or foreign file?)");
  CheckpointManifest m;
  LOOM_TRY(parse_header(j, file, m));
  LOOM_TRY(parse_files(j, file, m));
  if (!j.contains("slices") || !j["slices"].is_array()) return bad(file, "'slices' is missing");
  for (const json& s : j["slices"]) {
    LOOM_ASSIGN_OR_RETURN(CheckpointSlice c, parse_slice(s, file, m));
    m.slices.push_back(std::move(c));
  }
  return m;
}

}  // namespace loom
