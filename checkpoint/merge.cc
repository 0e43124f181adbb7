#include "checkpoint/merge.h"

#include <cerrno>
#include <cstdlib>

#include "checkpoint/safetensors.h"

namespace loom {

std::string merged_name(const std::string& kind, const std::string& name) {
  return kind == kSliceParam ? name : "optimizer." + kind + "." + name;
}

Result<CheckpointManifest> merged_manifest(const SafeTensorsFile& file, const std::string& name,
                                           uint64_t bytes, uint32_t crc, const std::string& path) {
  const auto& meta = file.metadata();
  auto bad = [&](const std::string& what) {
    return Error::at(path, "'" + path + "' is not a merged loom checkpoint: " + what);
  };
  if (!meta.count("format") || meta.at("format") != "loom-merged")
    return bad("__metadata__.format is not loom-merged");
  auto integer = [&](const char* key) -> Result<int64_t> {
    auto it = meta.find(key);
    if (it == meta.end()) return bad(std::string("__metadata__.") + key + " is missing");
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(it->second.c_str(), &end, 10);
    if (errno != 0 || it->second.empty() || *end != '\0' || v < 0)
      return bad(std::string("__metadata__.") + key + " is not a non-negative integer");
    return static_cast<int64_t>(v);
  };
  CheckpointManifest m;
  LOOM_ASSIGN_OR_RETURN(m.step, integer("step"));
  LOOM_ASSIGN_OR_RETURN(m.samples_seen, integer("samples_seen"));
  LOOM_ASSIGN_OR_RETURN(m.seed, integer("seed"));
  LOOM_ASSIGN_OR_RETURN(m.optimizer_steps, integer("optimizer_steps"));
  m.optimizer = meta.count("optimizer") ? meta.at("optimizer") : "";
  m.config_yaml = meta.count("config") ? meta.at("config") : "";
  m.plan = "merged";
  m.files.push_back({name, bytes, crc});
  for (const auto& t : file.tensors()) {
    std::string kind = kSliceParam, tensor = t.name;
    for (const char* k : {kSliceExpAvgSq, kSliceExpAvg}) {
      const std::string prefix = "optimizer." + std::string(k) + ".";
      if (t.name.rfind(prefix, 0) == 0) {
        kind = k;
        tensor = t.name.substr(prefix.size());
        break;
      }
    }
    SliceRanges all;
    for (int64_t d : t.shape) all.emplace_back(0, d);
    m.slices.push_back({tensor, kind, t.dtype, t.shape, all, 0, 1, name, t.name});
  }
  return m;
}

Result<std::string> merge_checkpoint(CheckpointReader& reader) {
  const CheckpointManifest& m = reader.manifest();
  SafeTensorsWriter writer;
  for (const char* kind : {kSliceParam, kSliceExpAvg, kSliceExpAvgSq}) {
    for (const std::string& name : reader.tensors(kind)) {
      LOOM_ASSIGN_OR_RETURN(auto desc, reader.describe(name, kind));
      SliceRanges all;
      for (int64_t d : desc.first) all.emplace_back(0, d);
      LOOM_ASSIGN_OR_RETURN(std::string bytes, reader.read(name, kind, all));
      writer.add(merged_name(kind, name), desc.second, desc.first, bytes);
    }
  }
  writer.set_metadata("format", "loom-merged");
  writer.set_metadata("step", std::to_string(m.step));
  writer.set_metadata("samples_seen", std::to_string(m.samples_seen));
  writer.set_metadata("seed", std::to_string(m.seed));
  writer.set_metadata("optimizer", m.optimizer);
  writer.set_metadata("optimizer_steps", std::to_string(m.optimizer_steps));
  writer.set_metadata("saved_under", m.plan + " (" + std::to_string(m.world_size) + " ranks)");
  writer.set_metadata("config", m.config_yaml);
  return writer.finish();
}

}  // namespace loom
