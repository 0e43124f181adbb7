// Swin Transformer (Liu et al., 2021) written as an annotated graph: patch embedding, stages of
// pre-norm blocks with window multi-head self-attention (relative position bias; every second
// block on cyclically shifted windows with the attention mask), GELU MLP, patch merging between
// stages, final norm, mean pooling, classification head and cross-entropy.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "core/result.h"
#include "graph/graph.h"
#include "graph/op_registry.h"
#include "planner/space_spec.h"

namespace loom::models {

struct SwinSpec {
  int64_t image = 224;  // square images, pixels per side
  int64_t channels = 3;
  int64_t patch = 4;
  int64_t embed = 96;  // C: features of stage 0; each stage doubles it
  std::vector<int64_t> depths = {2, 2, 6, 2};
  std::vector<int64_t> heads = {3, 6, 12, 24};
  int64_t window = 7;
  int64_t mlp_ratio = 4;
  int64_t classes = 1000;
  double init_std = 0.02;
  double ln_eps = 1e-5;

  int64_t stages() const { return static_cast<int64_t>(depths.size()); }
  int64_t dim(int64_t stage) const { return embed << stage; }
  int64_t resolution(int64_t stage) const { return (image / patch) >> stage; }  // tokens per side
  // Swin shrinks the window to the resolution, and then stops shifting it.
  int64_t window_at(int64_t stage) const { return std::min(window, resolution(stage)); }
  int64_t shift_at(int64_t stage) const { return resolution(stage) <= window ? 0 : window / 2; }
  int64_t blocks() const;
  int64_t parameter_count() const;
};

// Preset names: tiny, swin-t, swin-s, swin-b, swin-l, swin-1.8b (C 512, 640 px, window 40),
// swin-6.6b (C 768, 640 px, window 40), swin-6.6b-1536 (C 768, 1536 px, window 48).
std::vector<std::string> swin_presets();
// The preset named by model.preset with model.args applied; errors name the key and its line.
Result<SwinSpec> swin_spec(const Config& config);
// Checks the parallel config against the model: tensor parallelism (policy hybrid or tp) must
// divide every stage's heads and MLP width; pipeline stages must not outnumber the blocks.
// Window parallelism (policy `window`, degree parallel.tp) falls back per op where it cannot split.
Status check_swin_parallel(const Config& config, const planner::SpaceSpec& space);
// The graph of one micro-batch of `batch` images. Ops carry hints for the policies: `tp`
// (Megatron split of heads and MLP) and `wp` (the label that window parallelism splits).
Result<graph::Graph> build_swin(const SwinSpec& spec, int64_t batch,
                                const graph::OpRegistry& registry);

}  // namespace loom::models
