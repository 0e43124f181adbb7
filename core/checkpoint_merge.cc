#include "core/checkpoint_merge.h"

#include "core/safetensors.h"

namespace loom {

std::string merged_name(const std::string& kind, const std::string& name) {
  return kind == kSliceParam ? name : "optimizer." + kind + "." + name;
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
