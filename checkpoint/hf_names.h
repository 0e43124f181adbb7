// Hugging Face name maps: where each loom parameter of a model family lives in a Hugging Face
// checkpoint (`transformers`' names), which part of that tensor it is and whether it is stored
// transposed. One table per family serves both directions: loading a folder
// (checkpoint.init_from) reads each rank's pieces through it, and `loom checkpoint export-hf`
// assembles the Hugging Face tensors through it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/manifest.h"
#include "core/result.h"
#include "core/shape.h"

namespace loom {

// One loom parameter's place in a Hugging Face tensor.
struct HfSource {
  std::string tensor;  // the Hugging Face tensor name
  // Its shape as this map expects it; with `more_rows` its first dimension may be larger (GPT-2's
  // position table holds n_positions rows, loom's the run's seq).
  Shape shape;
  bool more_rows = false;
  // Where the loom parameter starts inside the tensor, per Hugging Face dimension (GPT-2's fused
  // c_attn holds q, k and v side by side).
  std::vector<int64_t> offset;
  // The loom parameter is the transpose of its region (GPT-2's Conv1D stores in x out; loom's
  // linears out x in).
  bool transposed = false;
  // The loom parameter has rows past the tensor's `shape[0]` (a vocabulary padded for tensor
  // parallelism): they are in no file, zero when loaded, and left out of an export.
  bool padded_rows = false;

  // The region of the Hugging Face tensor that holds region `loom` of the loom parameter.
  SliceRanges region(const SliceRanges& loom) const;
};

// The families with a map (model.type): gpt (GPT-2 names), llama.
bool has_hf_names(const std::string& model_type);
// The source of loom parameter `name` (full shape `shape`) of model family `model_type`; an
// error naming the parameter when the family's map has no such name. `vocab` (0: unknown) is the
// model's vocabulary: a token embedding or LM head with more rows holds padding past it.
Result<HfSource> hf_source(const std::string& model_type, const std::string& name,
                           const Shape& shape, int64_t vocab = 0);

// The prefix of the base model's names ("transformer." for GPT-2, "model." for Llama): a folder
// saved from the base model alone (GPT2Model, as openai-community/gpt2 is) names its tensors
// without it, and transformers accepts both.
std::string hf_base_prefix(const std::string& model_type);
// The token embedding's name in the full model ("transformer.wte.weight", "model.embed_tokens.
// weight"): the tensor a tied LM head shares.
std::string hf_embedding_name(const std::string& model_type);
// Whether a tensor of a folder may go unread by loom's model: buffers transformers once saved
// (GPT-2's causal masks attn.bias and attn.masked_bias, rotary inv_freq), not weights. Any
// other tensor no loom parameter reads means the folder holds another model (more layers, an
// untied head).
bool hf_buffer(const std::string& model_type, const std::string& hf_name);

}  // namespace loom
