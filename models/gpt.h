// GPT-2/GPT-3 style decoder written as an annotated graph: token and position embedding,
// pre-norm blocks (causal multi-head attention, GELU MLP), final norm, tied or untied LM head,
// cross-entropy loss.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "core/result.h"
#include "graph/graph.h"
#include "graph/op_registry.h"
#include "models/moe.h"

namespace loom::models {

struct GptSpec {
  int64_t layers = 2;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t vocab = 256;
  int64_t seq = 32;
  int64_t ffn_hidden = 256;  // 4 x hidden unless given
  bool tied = true;          // LM head shares the token embedding
  double init_std = 0.02;
  double ln_eps = 1e-5;
  // The MLP's activation: "gelu" (exact) or "gelu_tanh" (its tanh approximation, GPT-2's).
  std::string activation = "gelu";
  // The loss's log-sum-exp runs in this many vocabulary groups; tensor parallelism over the
  // vocabulary needs tp to divide it.
  int64_t vocab_groups = 16;
  // The embedding's and LM head's rows: vocab, or vocab padded where parallel.tp could not split
  // it (models/model.h, pad_vocab); the padded rows' logits are left out of the loss.
  int64_t vocab_rows = 256;
  // Mixture of experts in place of the MLP of some layers (model.args.moe); experts have no
  // biases.
  MoeSpec moe;

  int64_t head_dim() const { return hidden / heads; }
  int64_t parameter_count() const;
};

// Preset names: tiny, tiny-moe (4 experts, top 2), gpt2-124m, gpt3-350m, gpt3-1.3b, gpt3-2.7b,
// gpt3-6.7b, gpt3-13b, gpt3-175b.
std::vector<std::string> gpt_presets();
// The preset named by model.preset with model.args applied; errors name the key and its line.
Result<GptSpec> gpt_spec(const Config& config);
// The graph of one micro-batch of `batch` sequences.
Result<graph::Graph> build_gpt(const GptSpec& spec, int64_t batch,
                               const graph::OpRegistry& registry);

}  // namespace loom::models
