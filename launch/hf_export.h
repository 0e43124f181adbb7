// `loom checkpoint export-hf CHECKPOINT OUT`: a loom checkpoint saved under any plan as a Hugging
// Face folder transformers' from_pretrained loads (config.json and model.safetensors, float32),
// the tensors assembled through the model's name map (checkpoint/hf_names.h). LibTorch-free.
#pragma once

#include <filesystem>
#include <string>

#include "checkpoint/reader.h"
#include "core/result.h"

namespace loom::cli {

// Writes the folder `out` from `reader`'s checkpoint into `out`.tmp, then renames it to `out`, so
// an error leaves no half-written folder. The header is computed from the manifest and each
// Hugging Face tensor is assembled and written in turn: the export holds one of them at a time
// (besides the shards the reader keeps). `out` must not
// exist (or be an empty directory). Errors name the file, tensor or config key.
// What the run imported and never changed is exported as it was read from the folder the run was
// made from (checkpoint.init_from, model.from_hf): GPT-2's positions past the run's seq and the
// config's token ids. A folder that can no longer be read is said in `note`, not an error.
Status export_hf(CheckpointReader& reader, const std::filesystem::path& out,
                 std::string* note = nullptr);

}  // namespace loom::cli
