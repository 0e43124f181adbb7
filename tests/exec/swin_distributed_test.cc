// Swin tiny under dp, tp, pp and window parallelism equals one device: ranks as threads over the
// local backend, 5 steps; losses and every parameter piece against the single-device run.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <mutex>

#include "exec/comm/local_comm.h"
#include "exec/runtime/executor.h"
#include "exec/runtime/oracle.h"
#include "exec/runtime/rank_executor.h"
#include "exec/runtime/trainer.h"
#include "graph/verify.h"
#include "models/model.h"

namespace loom {
namespace {

constexpr int kSteps = 5;

Config config(const std::vector<std::string>& overrides) {
  const char* yaml = R"(run: {seed: 5, steps: 5}
model: {type: swin, preset: tiny}
batch: {global: 4, micro: 2}
optimizer: {type: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.01, clip_grad_norm: 1.0}
comm: {timeout_s: 60}
)";
  auto c = parse_config(yaml, "swin.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

struct Reference {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
};

const Reference& single_device() {
  static Reference r = [] {
    Reference out;
    auto t = runtime::Trainer::create(config({}));
    EXPECT_TRUE(t.ok()) << t.error().message;
    for (int i = 0; i < kSteps; ++i) out.losses.push_back((*t)->step()->loss);
    for (const auto& tensor : (*t)->graph().tensors())
      if (tensor.role == graph::TensorRole::kParameter)
        out.params[tensor.name] = (*t)->executor().parameter(tensor.name).detach().clone();
    return out;
  }();
  return r;
}

double rel(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-6);
}

void expect_equal_to_single_device(const std::vector<std::string>& overrides, int world_size) {
  const Reference& ref = single_device();
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kSteps));
  // The losses move, so equal curves are not equal by accident.
  EXPECT_NE(ref.losses.front(), ref.losses.back());
  Config c = config(overrides);
  comm::LocalWorld world(world_size, 60);
  std::mutex mu;
  std::vector<std::vector<double>> losses(world_size);
  std::vector<std::string> problems;
  auto statuses = world.run([&](comm::Comm& comm) -> Status {
    at::set_num_threads(1);
    LOOM_ASSIGN_OR_RETURN(auto trainer, runtime::Trainer::create(c, comm.shared_from_this()));
    const int64_t rank = comm.world_rank().value();
    for (int i = 0; i < kSteps; ++i) {
      LOOM_ASSIGN_OR_RETURN(auto st, trainer->step());
      losses[rank].push_back(st.loss);
    }
    auto& exec = trainer->rank_executor();
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < exec.parameters().size(); ++i) {
      const graph::SubTensor& piece = exec.parameter_pieces()[i];
      const std::string& name = trainer->graph().tensor(piece.tensor).name;
      // The key bias cannot change the output (softmax ignores a shift shared by all keys).
      if (name.find("attn.k.b") != std::string::npos) continue;
      double err =
          rel(exec.parameters()[i].detach(), runtime::cut_piece(ref.params.at(name), piece));
      if (err > 1e-5)
        problems.push_back("rank " + std::to_string(rank) + " " + name + piece.ranges_string() +
                           ": relative error " + std::to_string(err));
    }
    return Status::success();
  });
  for (int r = 0; r < world_size; ++r) ASSERT_TRUE(statuses[r].ok()) << statuses[r].error().message;
  for (int r = 0; r < world_size; ++r)
    for (int i = 0; i < kSteps; ++i)
      EXPECT_LE(std::abs(losses[r][i] - ref.losses[i]) / ref.losses[i], 1e-5)
          << "rank " << r << " step " << i + 1 << ": " << losses[r][i] << " vs " << ref.losses[i];
  EXPECT_TRUE(problems.empty()) << problems.size() << " pieces differ, first: " << problems[0];
}

TEST(SwinLocalRanks, Dp2) { expect_equal_to_single_device({"parallel.dp=2"}, 2); }
TEST(SwinLocalRanks, Tp2) { expect_equal_to_single_device({"parallel.tp=2"}, 2); }
TEST(SwinLocalRanks, Pp2) { expect_equal_to_single_device({"parallel.pp=2"}, 2); }
TEST(SwinLocalRanks, WindowParallel2) {
  expect_equal_to_single_device({"parallel.policy=window", "parallel.tp=2"}, 2);
}
TEST(SwinLocalRanks, WindowParallel2Dp2) {
  expect_equal_to_single_device({"parallel.policy=window", "parallel.tp=2", "parallel.dp=2"}, 4);
}

// Window parallelism splits the windows of attention and the image rows around it, and the
// channels where shifted windows mix rows: no op of the first stage holds the full activation.
TEST(SwinWindowPlan, SplitsWindowsRowsAndShiftedChannels) {
  Config c = config({"parallel.policy=window", "parallel.tp=2"});
  auto ops = graph::OpRegistry::with_builtin_ops();
  auto plan = models::build_plan(c, ops, planner::PolicyRegistry::with_builtin_policies(), 2);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_TRUE(graph::verify(*plan, ops).ok());
  std::map<std::string, std::string> split_dim;  // op name -> which output dimension is halved
  for (const auto& op : plan->ops()) {
    if (op.layer() != 0 && op.layer() != 1) continue;  // stage 0 of Swin
    const auto& out = op.outputs[0];
    const auto& full = plan->tensor(out.tensor).shape;
    std::string halved;
    for (size_t d = 0; d < full.size(); ++d)
      if (out.ranges[d].size() * 2 == full[d]) halved += std::to_string(d);
    split_dim[op.def->name] = halved;
  }
  EXPECT_EQ(split_dim.at("s0.b0.attn.windows"), "1");  // windows (unshifted: rows of windows)
  EXPECT_EQ(split_dim.at("s0.b0.attn.core"), "1");
  EXPECT_EQ(split_dim.at("s0.b1.attn.windows"), "3");  // shifted: channels
  EXPECT_EQ(split_dim.at("s0.b1.attn.core"), "1");
  EXPECT_EQ(split_dim.at("s0.b1.mlp.fc1.bias"), "1");  // image rows
  EXPECT_EQ(split_dim.at("s0.b1.attn.unwindows"), "3");
}

}  // namespace
}  // namespace loom
