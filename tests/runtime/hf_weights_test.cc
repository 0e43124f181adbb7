// checkpoint.init_from without transformers: a GPT-2 folder written here with closed-form values
// (element j of the k-th tensor is 1000 k + j), loaded on one rank and under tp2, pp2 and dp2 x
// zero 3 on local ranks. One rank's parameters are checked element by element against GPT-2's
// layout (Conv1D transposed, q/k/v as column blocks of c_attn, wpe's first seq rows); every
// other plan's pieces are the one-rank parameters' slices.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "checkpoint/safetensors.h"
#include "comm/local_comm.h"
#include "core/durable_file.h"
#include "launch/planned_trainer.h"
#include "models/hf_config.h"
#include "runtime/executor.h"
#include "runtime/oracle.h"
#include "runtime/trainer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kHidden = 8, kLayers = 2, kVocab = 16, kPositions = 8, kSeq = 4, kFfn = 32;

// The folder's tensors in GPT-2's names and layout, each filled with 1000 k + j.
std::map<std::string, at::Tensor> gpt2_tensors() {
  std::map<std::string, Shape> shapes = {{"transformer.wte.weight", {kVocab, kHidden}},
                                         {"transformer.wpe.weight", {kPositions, kHidden}},
                                         {"transformer.ln_f.weight", {kHidden}},
                                         {"transformer.ln_f.bias", {kHidden}}};
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    shapes[p + "ln_1.weight"] = {kHidden};
    shapes[p + "ln_1.bias"] = {kHidden};
    shapes[p + "ln_2.weight"] = {kHidden};
    shapes[p + "ln_2.bias"] = {kHidden};
    shapes[p + "attn.c_attn.weight"] = {kHidden, 3 * kHidden};
    shapes[p + "attn.c_attn.bias"] = {3 * kHidden};
    shapes[p + "attn.c_proj.weight"] = {kHidden, kHidden};
    shapes[p + "attn.c_proj.bias"] = {kHidden};
    shapes[p + "mlp.c_fc.weight"] = {kHidden, kFfn};
    shapes[p + "mlp.c_fc.bias"] = {kFfn};
    shapes[p + "mlp.c_proj.weight"] = {kFfn, kHidden};
    shapes[p + "mlp.c_proj.bias"] = {kHidden};
    shapes[p + "attn.bias"] = {1, 1, kPositions, kPositions};  // a buffer old files carry
  }
  std::map<std::string, at::Tensor> out;
  int64_t k = 0;
  for (const auto& [name, shape] : shapes)
    out[name] =
        (at::arange(numel(shape), at::kFloat) + 1000.0 * static_cast<double>(++k)).reshape(shape);
  return out;
}

fs::path write_folder(const std::map<std::string, at::Tensor>& tensors) {
  const fs::path dir = fs::path(::testing::TempDir()) / "loom_hf_weights_gpt2";
  fs::remove_all(dir);
  fs::create_directories(dir);
  SafeTensorsWriter w;
  for (const auto& [name, t] : tensors)
    w.add(name, "F32", Shape(t.sizes().begin(), t.sizes().end()),
          std::string_view(static_cast<const char*>(t.data_ptr()), t.numel() * 4));
  EXPECT_TRUE(write_file_durably(dir / "model.safetensors", w.finish()).ok());
  const std::string config = R"({"model_type": "gpt2", "n_layer": 2, "n_embd": 8, "n_head": 2,
    "vocab_size": 16, "n_positions": 8, "n_inner": 32, "activation_function": "gelu_new"})";
  EXPECT_TRUE(write_file_durably(dir / "config.json", config).ok());
  return dir;
}

Config config(const fs::path& folder, const std::vector<std::string>& overrides) {
  const std::string yaml =
      "run: {seed: 3, steps: 1}\nmodel: {type: gpt, from_hf: " + folder.string() +
      ", args: {seq: 4}}\nbatch: {global: 4, micro: 1}\n" +
      "checkpoint: {init_from: " + folder.string() + "}\ncomm: {timeout_s: 60}\n";
  auto c = parse_config(yaml, "hf.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  EXPECT_TRUE(models::apply_from_hf(*c).ok());
  return *c;
}

// Every rank's parameter pieces by (name, ranges) after loading.
using Pieces = std::map<std::string, std::pair<graph::SubTensor, at::Tensor>>;

std::vector<Pieces> load(const Config& c, int world_size) {
  comm::LocalWorld world(world_size, 60);
  std::vector<Pieces> out(static_cast<size_t>(world_size));
  std::mutex mu;
  auto statuses = world.run([&](comm::Comm& comm) -> Status {
    at::set_num_threads(1);
    LOOM_ASSIGN_OR_RETURN(auto trainer, launch::create_trainer(c, comm.shared_from_this()));
    auto& exec = trainer->executor();
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < exec.parameters().size(); ++i) {
      const graph::SubTensor& piece = exec.parameter_pieces()[i];
      const std::string name = trainer->graph().tensor(piece.tensor).name;
      out[static_cast<size_t>(comm.world_rank().value())][name + piece.ranges_string()] = {
          piece, exec.parameters()[i].detach().clone()};
    }
    return Status::success();
  });
  for (const auto& s : statuses) EXPECT_TRUE(s.ok()) << s.error().message;
  return out;
}

std::map<std::string, at::Tensor> full_params(const Pieces& one_rank) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, piece] : one_rank) out[key.substr(0, key.find('['))] = piece.second;
  return out;
}

TEST(HfWeights, OneRankHasGpt2sLayout) {
  const auto hf = gpt2_tensors();
  const Config c = config(write_folder(hf), {});
  const auto params = full_params(load(c, 1)[0]);
  ASSERT_EQ(params.size(), 2u + 2u + 16u * kLayers);  // wte wpe lnf.{w,b}; 16 per layer
  EXPECT_TRUE(at::equal(params.at("wte"), hf.at("transformer.wte.weight")));
  EXPECT_TRUE(at::equal(params.at("wpe"), hf.at("transformer.wpe.weight").slice(0, 0, kSeq)));
  EXPECT_TRUE(at::equal(params.at("lnf.b"), hf.at("transformer.ln_f.bias")));
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "h" + std::to_string(l) + ".";
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    const at::Tensor c_attn = hf.at(h + "attn.c_attn.weight");  // [in, 3 out]
    const char* qkv[] = {"q", "k", "v"};
    for (int64_t i = 0; i < 3; ++i) {
      const std::string w = p + "attn." + qkv[i] + ".w";
      EXPECT_TRUE(at::equal(params.at(w), c_attn.slice(1, i * kHidden, (i + 1) * kHidden).t()))
          << w;
      EXPECT_TRUE(at::equal(params.at(p + "attn." + qkv[i] + ".b"),
                            hf.at(h + "attn.c_attn.bias").slice(0, i * kHidden, (i + 1) * kHidden)))
          << p << qkv[i];
    }
    EXPECT_TRUE(at::equal(params.at(p + "attn.proj.w"), hf.at(h + "attn.c_proj.weight").t()));
    EXPECT_TRUE(at::equal(params.at(p + "mlp.fc1.w"), hf.at(h + "mlp.c_fc.weight").t()));
    EXPECT_TRUE(at::equal(params.at(p + "mlp.fc2.w"), hf.at(h + "mlp.c_proj.weight").t()));
    EXPECT_TRUE(at::equal(params.at(p + "mlp.fc2.b"), hf.at(h + "mlp.c_proj.bias")));
    EXPECT_TRUE(at::equal(params.at(p + "ln2.w"), hf.at(h + "ln_2.weight")));
  }
}

// Each plan's pieces are slices of the one-rank parameters: what every rank read from the file
// is its own region, whatever the split (tp: rows or columns of transposed blocks, zero 3:
// shards of every piece).
TEST(HfWeights, EveryPlanReadsItsSlices) {
  const fs::path folder = write_folder(gpt2_tensors());
  const auto full = full_params(load(config(folder, {}), 1)[0]);
  const std::vector<std::pair<std::vector<std::string>, int>> plans = {
      {{"parallel.tp=2"}, 2},
      {{"parallel.pp=2"}, 2},
      {{"parallel.dp=2", "parallel.zero=3"}, 2},
      {{"parallel.tp=2", "parallel.pp=2"}, 4}};
  for (const auto& [overrides, ranks] : plans) {
    const auto pieces = load(config(folder, overrides), ranks);
    std::set<std::string> held;
    for (size_t r = 0; r < pieces.size(); ++r)
      for (const auto& [key, piece] : pieces[r]) {
        const std::string name = key.substr(0, key.find('['));
        held.insert(name);
        EXPECT_TRUE(at::equal(piece.second, runtime::cut_piece(full.at(name), piece.first)))
            << overrides.back() << " rank " << r << " " << key;
      }
    EXPECT_EQ(held.size(), full.size()) << overrides.back();
  }
}

// A folder whose config.json ties the head (GPT-2's default) but which holds its own
// lm_head.weight: transformers ties the two only when the values are equal, and otherwise keeps
// the file's head. loom loads the first as tied and refuses the second under a tied model, naming
// model.args.tied=false, with which the head is the file's.
TEST(HfWeights, TiedFolderWithItsOwnHead) {
  auto hf = gpt2_tensors();
  hf["lm_head.weight"] = hf.at("transformer.wte.weight").clone();
  const auto same = full_params(load(config(write_folder(hf), {}), 1)[0]);
  EXPECT_EQ(same.count("lm_head.w"), 0u);
  EXPECT_TRUE(at::equal(same.at("wte"), hf.at("transformer.wte.weight")));

  hf["lm_head.weight"] = hf.at("transformer.wte.weight") * -1.0;
  const fs::path folder = write_folder(hf);
  comm::LocalWorld world(1, 60);
  const Config tied = config(folder, {});
  auto statuses = world.run([&](comm::Comm& comm) -> Status {
    auto trainer = launch::create_trainer(tied, comm.shared_from_this());
    if (!trainer.ok()) return trainer.error();
    return Status::success();
  });
  ASSERT_FALSE(statuses[0].ok()) << "a head unlike the embedding was dropped";
  for (const char* want : {"lm_head.weight", "transformer.wte.weight", "model.args.tied=false"})
    EXPECT_NE(statuses[0].error().message.find(want), std::string::npos)
        << want << " in " << statuses[0].error().message;

  const auto untied = full_params(load(config(folder, {"model.args.tied=false"}), 1)[0]);
  ASSERT_EQ(untied.count("lm_head.w"), 1u);
  EXPECT_TRUE(at::equal(untied.at("lm_head.w"), hf.at("lm_head.weight")));
  EXPECT_TRUE(at::equal(untied.at("wte"), hf.at("transformer.wte.weight")));
}

}  // namespace
}  // namespace loom
