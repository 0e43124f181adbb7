// The one cost model of loom (configs/cost-model.yaml): a device's sustained FLOP rate and memory,
// and alpha-beta costs per link class. The communication path search, the plan estimator and
// the planner's comparisons all read the same CostModel, resolved once per run from the
// config's `cost.*` keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"

namespace loom {

class Config;

struct CostModel {
  // A message of b bytes costs alpha + b * beta seconds.
  double intra_alpha_s = 5e-6;  // within a node
  double intra_beta_s_per_byte = 1e-11;
  double inter_alpha_s = 20e-6;  // between nodes
  double inter_beta_s_per_byte = 8e-11;
  double local_beta_s_per_byte = 2e-12;  // a copy on one device
  int64_t devices_per_node = 8;
  double device_flops_per_s = 100e12;  // sustained per device
  double device_memory_bytes = 80.0 * (1ull << 30);
  std::string name = "default";  // the preset and where it came from, for what a plan prints

  // One flat mapping of the keys above (a user's single model); errors name the key and line.
  static Result<CostModel> parse(const std::string& yaml, const std::string& source);
  static Result<CostModel> load(const std::string& path);
};

// The keys of a cost model, as they appear in the file and as `cost.<key>` config keys.
std::vector<std::string> cost_model_keys();

// The presets of a cost-model file (`default:` and `presets:`) or, for a flat mapping, its one
// model (named "custom"); `source` names the file in messages.
struct CostModelFile {
  std::string default_preset;
  std::vector<std::pair<std::string, CostModel>> presets;
};
Result<CostModelFile> parse_cost_model_file(const std::string& yaml, const std::string& source);

// configs/cost-model.yaml as built into loom.
const CostModelFile& builtin_cost_models();

// The run's cost model: cost.file (default: the built-in configs/cost-model.yaml), its preset
// cost.preset (default: the file's default), then each cost.<key> set to a positive value.
// Errors name the cost.* key and where it came from.
Result<CostModel> resolve_cost_model(const Config& config);

}  // namespace loom
