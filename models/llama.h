// Llama-shaped decoder written as an annotated graph: token embedding, pre-norm blocks (RMSNorm,
// grouped-query causal attention with rotary positions, SwiGLU MLP), no biases, final RMSNorm,
// untied or tied LM head, the vocabulary-grouped cross-entropy GPT uses.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "core/result.h"
#include "graph/graph.h"
#include "graph/op_registry.h"
#include "models/moe.h"

namespace loom::models {

struct LlamaSpec {
  int64_t layers = 2;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t kv_heads = 2;  // grouped-query attention: heads / kv_heads query heads share a kv head
  int64_t vocab = 256;
  int64_t seq = 32;
  int64_t ffn_hidden = 160;  // SwiGLU's intermediate size
  bool tied = false;         // LM head shares the token embedding
  double init_std = 0.02;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  // Llama 3.1's rotary frequency scaling; factor 0 leaves the frequencies as they are.
  double rope_factor = 0;
  double rope_low_freq_factor = 1;
  double rope_high_freq_factor = 4;
  int64_t rope_original_max_positions = 8192;
  int64_t vocab_groups = 16;  // as GptSpec::vocab_groups
  int64_t vocab_rows = 256;   // as GptSpec::vocab_rows
  // Mixture of experts in place of the SwiGLU MLP of some layers (model.args.moe).
  MoeSpec moe;

  int64_t head_dim() const { return hidden / heads; }
  int64_t parameter_count() const;
};

// Preset names: tiny, llama3-8b, llama3-70b, llama3.1-8b, llama3.1-70b, llama3.1-405b; with
// experts: tiny-moe, mixtral-8x7b, deepseek-v3 (DeepSeek-V3's experts, 256 routed, top 8, one
// shared, sigmoid scores, on Llama attention in place of its latent attention: for plans).
std::vector<std::string> llama_presets();
// The preset named by model.preset with model.args applied; errors name the key and its line.
Result<LlamaSpec> llama_spec(const Config& config);
// tp, pp and chunks against the spec: heads, ffn_hidden and vocab_groups divisible by tp; kv
// heads divisible by tp, or tp a multiple of them (each kv head is then repeated on the tp ranks
// that share it, as Megatron does).
Status check_llama_parallel(const Config& config, const planner::SpaceSpec& space);
// The graph of one micro-batch of `batch` sequences for tensor parallelism `tp` (which decides
// whether kv heads are split or repeated).
Result<graph::Graph> build_llama(const LlamaSpec& spec, int64_t batch, int64_t tp,
                                 const graph::OpRegistry& registry);

}  // namespace loom::models
