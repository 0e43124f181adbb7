// Before any step, every rank checks that it runs what rank 0 runs: the same resolved config,
// the same plan and the same build of loom. Two ranks started with different overrides would
// otherwise train two different models and report one loss.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "core/config.h"
#include "core/result.h"
#include "runtime/device.h"

namespace loom::runtime {

// What a rank must share with rank 0.
struct RankFacts {
  std::string config_yaml;  // the resolved config (to_yaml)
  std::string plan;         // the plan's digest
  std::string build;        // loom's version and build id
};

// This rank's facts: the resolved config, the plan's digest and this build.
RankFacts facts_of(const Config& config, const std::string& plan_digest);

// Collective over `world`: compares every rank's facts with rank 0's (a digest each, all
// gathered; the texts only when they differ). On a difference every rank returns the same
// error, naming the first config key that differs (or the plan, or the build), rank 0's value
// and the other's, and the ranks that differ.
Status check_ranks_agree(comm::Comm& world, const RunDevice& device, const RankFacts& mine);

// The resolved config's keys and values in file order ("model.args.layers", "4"), read back
// from to_yaml's text.
std::vector<std::pair<std::string, std::string>> flatten_config_yaml(const std::string& yaml);

}  // namespace loom::runtime
