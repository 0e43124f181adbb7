// A Hugging Face config.json as loom's model.args, and back: `model.from_hf: DIR` fills
// model.args from DIR/config.json (GPT-2 and Llama keys), and `loom checkpoint export-hf`
// writes the config.json transformers reads for a loom model.
#pragma once

#include <string>

#include "core/config.h"
#include "core/result.h"

namespace loom::models {

// With model.from_hf set: every model.args value the folder's config.json determines, written
// into config.model.args (their origin recorded as the file). An explicit model.args value that
// disagrees is an error naming both keys and both values; so is a config.json whose model_type
// is not model.type's, or which asks for what loom's model does not compute (biases in Llama's
// projections, another activation). `seq` stays the run's: it must fit the folder's positions.
// model.args.tied false may untie a folder that says tied (its own lm_head.weight is then read,
// as transformers does when the file's head differs from the embedding).
// With checkpoint.init_from set (with or without model.from_hf): the folder's config.json must
// agree with the run's model (preset and model.args), else an error naming the folder's key and
// value and the run's; its weights would otherwise load into another model.
Status apply_from_hf(Config& config);

// The config.json of `config`'s model (model.type gpt or llama) that transformers'
// from_pretrained reads, float32 weights.
Result<std::string> hf_config_json(const Config& config);

}  // namespace loom::models
