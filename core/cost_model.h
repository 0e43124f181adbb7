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

// Every value comes from configs/cost-model.yaml, its one home: a default-constructed CostModel
// is empty (zeros), and CostModel::builtin() is the file's default preset as built into loom.
struct CostModel {
  // A message of b bytes costs alpha + b * beta seconds.
  double intra_alpha_s = 0;  // within a node
  double intra_beta_s_per_byte = 0;
  double inter_alpha_s = 0;  // between nodes
  double inter_beta_s_per_byte = 0;
  double local_beta_s_per_byte = 0;  // a copy on one device
  int64_t devices_per_node = 0;
  double device_flops_per_s = 0;  // sustained by one device computing alone
  double device_memory_bytes = 0;
  // What all devices of a node sustain computing at once; 0: devices_per_node times
  // device_flops_per_s (devices that share nothing, as GPUs do). Less where ranks share cores:
  // a node's busy ranks then split its rate, and one alone runs at device_flops_per_s.
  double node_flops_per_s = 0;
  // A primitive's own alpha and beta within a node, where it differs from the link's (loom
  // calibrate fits each through lower's cost formula); 0: intra_alpha_s,
  // intra_beta_s_per_byte.
  double intra_send_recv_alpha_s = 0;
  double intra_send_recv_beta_s_per_byte = 0;
  double intra_all_reduce_alpha_s = 0;
  double intra_all_reduce_beta_s_per_byte = 0;
  double intra_all_gather_alpha_s = 0;
  double intra_all_gather_beta_s_per_byte = 0;
  double intra_reduce_scatter_alpha_s = 0;
  double intra_reduce_scatter_beta_s_per_byte = 0;
  double intra_all_to_all_alpha_s = 0;
  double intra_all_to_all_beta_s_per_byte = 0;
  std::string name;  // the preset and where it came from, for what a plan prints

  // The built-in configs/cost-model.yaml's default preset: what a plan, a path search or a test
  // that names no cost model assumes.
  static const CostModel& builtin();

  struct Link {
    double alpha_s = 0;
    double beta_s_per_byte = 0;
  };
  // The alpha and beta of `primitive` (lower's name: "all_gather", "send_recv", ...) within
  // a node: its own where given, else the link's.
  Link intra_link(const std::string& primitive) const;
  // The link `primitive` crosses: between nodes (`inter`) the inter-node link, else intra_link.
  // The one place the communication path search and the estimator choose it.
  Link link(const std::string& primitive, bool inter) const;
  // Gives `primitive` its own alpha and beta; false when it has no keys of its own.
  bool set_intra_link(const std::string& primitive, const Link& link);
  // What a node's devices sustain together (node_flops_per_s, at most devices_per_node times
  // device_flops_per_s).
  double node_compute_flops_per_s() const;

  // One flat mapping of the keys above (a user's single model; a key it leaves out keeps
  // builtin()'s value); errors name the key and line.
  static Result<CostModel> parse(const std::string& yaml, const std::string& source);
  static Result<CostModel> load(const std::string& path);
};

// The keys of a cost model, as they appear in the file and as `cost.<key>` config keys.
std::vector<std::string> cost_model_keys();
// Every value of `model` as "key=value" lines in cost_model_keys() order (what a plan's hash
// covers of its cost model; the name is left out).
std::string cost_model_values(const CostModel& model);

// The presets of a cost-model file (`default:` and `presets:`) or, for a flat mapping, its one
// model (named "custom"); a key a model leaves out keeps CostModel::builtin()'s value; `source`
// names the file in messages.
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
