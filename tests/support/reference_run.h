// Test support: the single-device run a parallel run is compared with, and the comparison of
// the results that train_worker processes write (rank_K.json + rank_K.bin) against it, under the
// numerical policy of tests/support/tolerance.h.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/single_device_run.h"
#include "runtime/executor.h"
#include "runtime/oracle.h"
#include "runtime/trainer.h"
#include "tests/support/tolerance.h"

namespace loom::testing_support {

struct Reference {
  std::vector<double> losses;                // per step
  std::map<std::string, at::Tensor> init;    // before the first step, by FullTensor name
  std::map<std::string, at::Tensor> params;  // after the last step, by FullTensor name
  OptimizerTrace trace;                      // the updates, to bound what rounding can do
};

using launch::parameters_of;

// The single-device run of `config` (launch/verify.h, as `loom verify` makes it).
inline Reference train_single_device(const Config& config, int steps) {
  Reference r;
  auto run = launch::run_single_device(config, steps);
  EXPECT_TRUE(run.ok()) << run.error().message;
  if (!run.ok()) return r;
  r.losses = run->losses;
  r.init = run->init;
  if (!run->params.empty()) r.params = run->params.back();
  r.trace = run->trace;
  return r;
}

inline bool is_noise(const std::string& name, const std::vector<std::string>& noise) {
  for (const auto& n : noise)
    if (name.find(n) != std::string::npos) return true;
  return false;
}

// The losses and parameter pieces train_worker's ranks wrote into `dir` equal `ref`: losses
// within loss_tolerance, every piece (but `noise`) within the policy's bound. Returns how
// many pieces were compared, over all ranks.
inline int expect_worker_results_equal(const Reference& ref, const std::filesystem::path& dir,
                                       int world_size, const std::vector<std::string>& noise) {
  int checked = 0;
  for (int r = 0; r < world_size; ++r) {
    std::ifstream idx(dir / ("rank_" + std::to_string(r) + ".json"));
    EXPECT_TRUE(idx) << "rank " << r << " wrote no results";
    if (!idx) continue;
    nlohmann::json index = nlohmann::json::parse(idx);
    std::ifstream bin(dir / ("rank_" + std::to_string(r) + ".bin"), std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(bin)),
                            std::istreambuf_iterator<char>());
    const float* data = reinterpret_cast<const float*>(bytes.data());
    auto losses = index["losses"].get<std::vector<double>>();
    EXPECT_EQ(losses.size(), ref.losses.size()) << "rank " << r;
    for (size_t i = 0; i < std::min(losses.size(), ref.losses.size()); ++i)
      EXPECT_LE(std::abs(losses[i] - ref.losses[i]) / ref.losses[i], loss_tolerance(ref.trace))
          << "rank " << r << " step " << i + 1 << ": " << losses[i] << " vs " << ref.losses[i];
    for (const auto& p : index["params"]) {
      const std::string name = p["name"];
      if (is_noise(name, noise)) continue;
      graph::SubTensor piece;
      for (const auto& range : p["ranges"]) piece.ranges.push_back({range[0], range[1]});
      at::Tensor want = runtime::cut_piece(ref.params.at(name), piece);
      const int64_t offset = p["offset"].get<int64_t>();
      EXPECT_LE((offset + want.numel()) * 4, static_cast<int64_t>(bytes.size())) << name;
      if ((offset + want.numel()) * 4 > static_cast<int64_t>(bytes.size())) continue;
      at::Tensor got = at::from_blob(const_cast<float*>(data) + offset, want.sizes(), at::kFloat);
      const auto differs =
          compare_parameter(got, want, runtime::cut_piece(ref.init.at(name), piece),
                            parameter_tolerance(ref.trace, name));
      EXPECT_FALSE(differs) << "rank " << r << " " << name << piece.ranges_string() << ": "
                            << differs.value_or("");
      ++checked;
    }
  }
  return checked;
}

}  // namespace loom::testing_support
