// Every precision on every CPU backend and every layout: {fp32, bf16} x {local, gloo, mpi} x
// {dp2, tp2, pp2, tp2 with sp, dp2 zero 1, dp2 zero 3, tp2 x pp2}. Each trains GPT tiny and equals
// the single-device run of the same precision, losses and every parameter piece, within that
// precision's terms of the tolerance policy (runtime/tolerance.h: bf16's bound is the one a
// plan's bf16 partial sums justify, fp32's the reordering of float32 sums). Collectives and
// point-to-point messages carry bf16 tensors here: tp's all-reduces of activations, sp's
// all-gathers and reduce-scatters, pp's activations and gradients, zero 3's parameter gathers.
// local: ranks as threads in this process; gloo: train_worker processes over TCP, started as
// loomrun starts them; mpi: train_worker under mpirun.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <tuple>

#include "launch/spawn.h"
#include "tests/runtime/local_ranks.h"
#include "tests/support/reference_run.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

const std::string kWorker = std::string(LOOM_BINARY_DIR) + "/bin/train_worker";
constexpr int kSteps = 4;

// train_worker.cc's config, with the precision.
const char* kYaml = R"(run: {seed: 3, steps: 10}
model: {type: gpt, preset: tiny}
batch: {global: 8, micro: 2}
optimizer: {type: sgd, lr: 0.3, momentum: 0.9, weight_decay: 0.01, clip_grad_norm: 1.0}
comm: {timeout_s: 60}
)";

struct Layout {
  const char* name;
  std::vector<std::string> overrides;
  int world_size;
};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"Dp2", {"parallel.dp=2"}, 2},
      {"Tp2", {"parallel.tp=2"}, 2},
      {"Pp2", {"parallel.pp=2"}, 2},
      {"Tp2Sp", {"parallel.tp=2", "parallel.sp=true"}, 2},
      {"Dp2Zero1", {"parallel.dp=2", "parallel.zero=1"}, 2},
      {"Dp2Zero3", {"parallel.dp=2", "parallel.zero=3"}, 2},
      {"Tp2Pp2", {"parallel.tp=2", "parallel.pp=2"}, 4},
      // Context parallelism: ring attention's key/value chunks and their gradients cross ranks
      // point to point in the run's precision.
      {"Cp2", {"parallel.cp=2"}, 2},
  };
  return all;
}

// The single-device run in `precision` (SGD with momentum: zero 1 shards its momentum).
const testing_support::Reference& single_device(const std::string& precision) {
  static std::map<std::string, testing_support::Reference> runs;
  auto it = runs.find(precision);
  if (it != runs.end()) return it->second;
  auto c = parse_config(kYaml, "ref.yaml", {"run.precision=" + precision});
  EXPECT_TRUE(c.ok()) << c.error().message;
  at::set_num_threads(1);
  return runs.emplace(precision, testing_support::train_single_device(*c, kSteps)).first->second;
}

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::path(::testing::TempDir()) / ("loom_matrix_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

using Cell = std::tuple<std::string, std::string, size_t>;  // precision, backend, layout

class PrecisionMatrix : public ::testing::TestWithParam<Cell> {};

TEST_P(PrecisionMatrix, EqualsOneDevice) {
  const auto& [precision, backend, index] = GetParam();
  const Layout& layout = layouts()[index];
  const testing_support::Reference& ref = single_device(precision);
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kSteps));
  std::vector<std::string> overrides = layout.overrides;
  overrides.push_back("run.precision=" + precision);
  // The key bias only follows rounding noise (a shift every softmax score shares).
  const std::vector<std::string> noise = {"attn.k.b"};
  if (backend == "local") {
    auto c = parse_config(kYaml, "matrix.yaml", overrides);
    ASSERT_TRUE(c.ok()) << c.error().message;
    testing_support::expect_equal_to_single_device(ref, *c, layout.world_size, noise);
    return;
  }
  const fs::path dir = fresh_dir(precision + "_" + backend + "_" + layout.name);
  std::vector<std::string> args = overrides;
  args.insert(args.end(), {"comm.backend=" + backend, "--steps", std::to_string(kSteps), "--out",
                           dir.string()});
  if (backend == "gloo") {
    auto results = launch::spawn_workers(kWorker, layout.world_size, args, 120);
    for (const auto& r : results) ASSERT_TRUE(r.ok()) << launch::describe(results);
  } else {
    if (launch::find_program("mpirun").empty()) GTEST_SKIP() << "mpirun is not installed";
    launch::Launch launch;
    launch.argv = launch::mpirun_argv();
    launch.argv.insert(launch.argv.end(), {"-np", std::to_string(layout.world_size), kWorker});
    launch.argv.insert(launch.argv.end(), args.begin(), args.end());
    launch.env = {{"OMP_NUM_THREADS", "1"}};
    auto results = launch::run_processes({launch}, 120);
    ASSERT_TRUE(results[0].ok()) << results[0].describe();
  }
  EXPECT_GT(testing_support::expect_worker_results_equal(ref, dir, layout.world_size, noise), 0);
}

std::string cell_name(const ::testing::TestParamInfo<Cell>& info) {
  const auto& [precision, backend, index] = info.param;
  std::string p = precision, b = backend;
  p[0] = static_cast<char>(std::toupper(p[0]));
  b[0] = static_cast<char>(std::toupper(b[0]));
  return p + "_" + b + "_" + layouts()[index].name;
}

INSTANTIATE_TEST_SUITE_P(All, PrecisionMatrix,
                         ::testing::Combine(::testing::Values("fp32", "bf16"),
                                            ::testing::Values("local", "gloo", "mpi"),
                                            ::testing::Range<size_t>(0, layouts().size())),
                         cell_name);

}  // namespace
}  // namespace loom
