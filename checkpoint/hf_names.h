// Hugging Face name maps: where each loom parameter of a model family lives in a Hugging Face
// checkpoint (`transformers`' names), which part of that tensor it is and whether it is stored
// transposed. The tables are the model registry's (models/hf_names.h); one per family serves both
// directions: loading a folder
// (checkpoint.init_from) reads each rank's pieces through it, and `loom checkpoint export-hf`
// assembles the Hugging Face tensors through it.
#pragma once

#include <cstdint>
#include <functional>
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

// One model family's names in Hugging Face checkpoints (transformers'). A model registry entry
// carries its family's (models/model.h: ModelType::hf_names); empty for a family without one.
struct HfNameMap {
  // The source of loom parameter `name` (full shape `shape`) before any vocabulary padding; an
  // error naming the parameter when the family has no such name.
  std::function<Result<HfSource>(const std::string& name, const Shape& shape)> lookup;
  // The prefix of the base model's names ("transformer." for GPT-2, "model." for Llama): a
  // folder saved from the base model alone (GPT2Model, as openai-community/gpt2 is) names its
  // tensors without it, and transformers accepts both.
  std::string base_prefix;
  // The token embedding's name in the full model ("transformer.wte.weight"): the tensor a tied
  // LM head shares.
  std::string embedding;
  // Endings of the tensors a folder may hold that no parameter reads: buffers transformers once
  // saved (GPT-2's causal masks attn.bias and attn.masked_bias, rotary inv_freq), not weights.
  // Any other tensor no loom parameter reads means the folder holds another model.
  std::vector<std::string> buffers;

  bool empty() const { return !lookup; }
  // `lookup`'s source of `name`; `vocab` (0: unknown) is the model's vocabulary: a token
  // embedding or LM head with more rows holds padding past it (padded_rows).
  Result<HfSource> source(const std::string& name, const Shape& shape, int64_t vocab = 0) const;
  // Whether tensor `hf_name` of a folder ends as one of `buffers`.
  bool buffer(const std::string& hf_name) const;
};

}  // namespace loom
