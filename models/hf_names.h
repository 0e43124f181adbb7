// The Hugging Face name maps of loom's zoo (checkpoint/hf_names.h): GPT's as GPT-2's names
// (transformers' GPT2LMHeadModel) and Llama's (LlamaForCausalLM). The model registry gives each
// to its type (ModelType::hf_names).
#pragma once

#include "checkpoint/hf_names.h"

namespace loom::models {

HfNameMap gpt2_hf_names();
HfNameMap llama_hf_names();

}  // namespace loom::models
