#include "core/cost_model.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/config.h"
#include "core/run_spec.h"
#include "core/training_state.h"

namespace loom {
namespace {

TEST(CostModel, ParsesAndRejects) {
  auto m = CostModel::parse("intra_alpha_s: 1e-6\ndevices_per_node: 4\n", "c.yaml");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->devices_per_node, 4);
  EXPECT_DOUBLE_EQ(m->intra_alpha_s, 1e-6);
  auto bad = CostModel::parse("intra_alpha: 1\n", "c.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find(
                "c.yaml:1: intra_alpha: unknown key (did you mean 'intra_alpha_s'?)"),
            std::string::npos);
  EXPECT_FALSE(CostModel::parse("devices_per_node: 0\n", "c.yaml").ok());
  EXPECT_FALSE(CostModel::parse("device_flops_per_s: fast\n", "c.yaml").ok());
}

// configs/cost-model.yaml is built in with a preset per device class loom plans for.
TEST(CostModel, BuiltInPresets) {
  const CostModelFile& file = builtin_cost_models();
  std::vector<std::string> names;
  for (const auto& [name, m] : file.presets) names.push_back(name);
  for (const char* want : {"cpu", "a100", "h100", "h200"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  EXPECT_EQ(file.default_preset, "a100");
  for (const auto& [name, m] : file.presets) {
    EXPECT_GT(m.device_flops_per_s, 0) << name;
    EXPECT_GT(m.device_memory_bytes, 0) << name;
    EXPECT_GT(m.intra_beta_s_per_byte, 0) << name;
    // The network is never faster than the links within a node.
    EXPECT_GE(m.inter_beta_s_per_byte, m.intra_beta_s_per_byte) << name;
  }
}

// The file is the one home of the values: an empty model is empty, the built-in one is the
// file's default preset, and a user's file that leaves a key out keeps that preset's value.
TEST(CostModel, ValuesLiveOnlyInTheFile) {
  EXPECT_EQ(CostModel{}.device_flops_per_s, 0);
  EXPECT_EQ(CostModel{}.devices_per_node, 0);
  const CostModel& builtin = CostModel::builtin();
  auto resolved = resolve_cost_model(Config{});
  ASSERT_TRUE(resolved.ok());
  EXPECT_EQ(builtin.name, resolved->name);
  EXPECT_EQ(builtin.device_flops_per_s, resolved->device_flops_per_s);
  EXPECT_EQ(builtin.inter_beta_s_per_byte, resolved->inter_beta_s_per_byte);
  EXPECT_EQ(builtin.devices_per_node, resolved->devices_per_node);
  auto partial = CostModel::parse("intra_alpha_s: 1e-6\n", "c.yaml");
  ASSERT_TRUE(partial.ok());
  EXPECT_EQ(partial->device_memory_bytes, builtin.device_memory_bytes);
  EXPECT_EQ(partial->local_beta_s_per_byte, builtin.local_beta_s_per_byte);
}

// Weights, gradients and optimizer state are float32 whatever the run's precision; SGD keeps
// one buffer with or without momentum, AdamW two moments.
// The link a primitive crosses: a primitive's own intra-node figures where set, the link's
// otherwise, and the inter-node link between nodes whatever the primitive.
TEST(CostModel, LinkOfAPrimitiveWithinAndBetweenNodes) {
  CostModel m;
  m.intra_alpha_s = 1e-6;
  m.intra_beta_s_per_byte = 1e-10;
  m.inter_alpha_s = 5e-6;
  m.inter_beta_s_per_byte = 4e-10;
  ASSERT_TRUE(m.set_intra_link("all_reduce", {2e-6, 3e-10}));
  EXPECT_EQ(m.link("all_reduce", false).alpha_s, 2e-6);
  EXPECT_EQ(m.link("all_reduce", false).beta_s_per_byte, 3e-10);
  EXPECT_EQ(m.link("all_gather", false).alpha_s, 1e-6);
  EXPECT_EQ(m.link("all_gather", false).beta_s_per_byte, 1e-10);
  for (const char* p : {"all_reduce", "all_gather", "send_recv"}) {
    EXPECT_EQ(m.link(p, true).alpha_s, 5e-6) << p;
    EXPECT_EQ(m.link(p, true).beta_s_per_byte, 4e-10) << p;
  }
}

TEST(TrainingState, BytesPerParameter) {
  EXPECT_EQ(training_state_bytes(OptimizerKind::kAdamw).total(), 16);
  EXPECT_EQ(training_state_bytes(OptimizerKind::kSgd).total(), 12);
}

// Every spelling the config accepts names one value and back; CommTraits are decided per backend.
TEST(RunSpec, NamesRoundTripAndAutoResolvesPerDevice) {
  for (const char* n : {"cpu", "cuda"}) EXPECT_EQ(name(*parse_device(n)), n);
  for (const char* n : {"fp32", "bf16", "fp8"}) EXPECT_EQ(name(*parse_precision(n)), n);
  for (const char* n : {"auto", "gloo", "mpi", "nccl", "local"})
    EXPECT_EQ(name(*parse_backend(n)), n);
  for (const char* n : {"adamw", "sgd"}) EXPECT_EQ(name(*parse_optimizer(n)), n);
  auto bad = parse_backend("ucx");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("expected auto, gloo, mpi, nccl, local"), std::string::npos)
      << bad.error().message;
  EXPECT_EQ(job_backend(CommBackend::kAuto, Device::kCuda), CommBackend::kNccl);
  EXPECT_EQ(job_backend(CommBackend::kAuto, Device::kCpu), CommBackend::kGloo);
  EXPECT_EQ(job_backend(CommBackend::kMpi, Device::kCuda), CommBackend::kMpi);
  EXPECT_TRUE(CommTraits::of(CommBackend::kNccl).defers_sends);
  EXPECT_TRUE(CommTraits::of(CommBackend::kLocal).collectives_through_all_to_all);
  EXPECT_TRUE(CommTraits::of(CommBackend::kMpi).shard_out_of_place);
  EXPECT_FALSE(CommTraits::of(CommBackend::kGloo).shard_out_of_place);
  EXPECT_EQ((BatchSpec{16, 2, 2}).micro_batches(), 4);
  EXPECT_EQ((BatchSpec{16, 2, 2}).formula(), "batch.global 16 / (batch.micro 2 x parallel.dp 2)");
}

TEST(CostModel, ResolvedFromTheConfig) {
  auto c = parse_config("model: {type: gpt}\n", "c.yaml",
                        {"cost.preset=h200", "cost.inter_alpha_s=1e-3"});
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto m = resolve_cost_model(*c);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_DOUBLE_EQ(m->inter_alpha_s, 1e-3);
  EXPECT_DOUBLE_EQ(m->device_memory_bytes, 141e9);  // the H200's HBM
  EXPECT_NE(m->name.find("h200"), std::string::npos) << m->name;
  EXPECT_NE(m->name.find("cost.inter_alpha_s"), std::string::npos) << m->name;

  auto plain = parse_config("model: {type: gpt}\n", "c.yaml");
  ASSERT_TRUE(plain.ok());
  auto a100 = resolve_cost_model(*plain);
  ASSERT_TRUE(a100.ok());
  EXPECT_DOUBLE_EQ(a100->device_flops_per_s, 100e12);
  EXPECT_EQ(a100->name, "a100 from the built-in configs/cost-model.yaml");
}

TEST(CostModel, AnUnknownPresetNamesTheKeyAndTheChoices) {
  auto c = parse_config("model: {type: gpt}\ncost: {preset: h10}\n", "c.yaml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto m = resolve_cost_model(*c);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("c.yaml:2"), std::string::npos) << m.error().message;
  EXPECT_NE(m.error().message.find("did you mean 'h100'"), std::string::npos) << m.error().message;
  EXPECT_NE(m.error().message.find("presets: a100, h100, h200, cpu"), std::string::npos)
      << m.error().message;
}

TEST(CostModel, AUserFileOfOneModelOrOfPresets) {
  const auto dir = std::filesystem::temp_directory_path() / "loom_cost_model_test";
  std::filesystem::create_directories(dir);
  const auto flat = dir / "flat.yaml", presets = dir / "presets.yaml", bad = dir / "bad.yaml";
  std::ofstream(flat) << "device_flops_per_s: 2e12\n";
  std::ofstream(presets) << "default: slow\npresets:\n  slow: {device_flops_per_s: 1e9}\n  fast: "
                            "{device_flops_per_s: 1e15}\n";
  std::ofstream(bad) << "presets:\n  x: {device_flop_per_s: 1}\n";

  auto c1 = parse_config("model: {type: gpt}\n", "c.yaml", {"cost.file=" + flat.string()});
  ASSERT_TRUE(c1.ok());
  auto m1 = resolve_cost_model(*c1);
  ASSERT_TRUE(m1.ok()) << m1.error().message;
  EXPECT_DOUBLE_EQ(m1->device_flops_per_s, 2e12);

  auto c2 = parse_config("model: {type: gpt}\n", "c.yaml", {"cost.file=" + presets.string()});
  auto m2 = resolve_cost_model(*c2);
  ASSERT_TRUE(m2.ok()) << m2.error().message;
  EXPECT_DOUBLE_EQ(m2->device_flops_per_s, 1e9);
  auto c3 = parse_config("model: {type: gpt}\n", "c.yaml",
                         {"cost.file=" + presets.string(), "cost.preset=fast"});
  auto m3 = resolve_cost_model(*c3);
  ASSERT_TRUE(m3.ok()) << m3.error().message;
  EXPECT_DOUBLE_EQ(m3->device_flops_per_s, 1e15);

  auto c4 = parse_config("model: {type: gpt}\n", "c.yaml", {"cost.file=" + bad.string()});
  auto m4 = resolve_cost_model(*c4);
  ASSERT_FALSE(m4.ok());
  EXPECT_NE(m4.error().message.find("bad.yaml:2: device_flop_per_s: unknown key"),
            std::string::npos)
      << m4.error().message;
  EXPECT_NE(m4.error().message.find("cost.file"), std::string::npos) << m4.error().message;

  auto c5 = parse_config("model: {type: gpt}\n", "c.yaml",
                         {"cost.file=" + (dir / "missing.yaml").string()});
  EXPECT_FALSE(resolve_cost_model(*c5).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace loom
