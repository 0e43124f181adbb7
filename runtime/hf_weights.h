// checkpoint.init_from: a rank's parameter pieces read from a Hugging Face model folder through
// the model's name map (checkpoint/hf_names.h), each piece as the byte ranges of its slice
// (checkpoint/hf_folder.h), so no rank holds a tensor it does not own.
#pragma once

#include <filesystem>

#include "checkpoint/hf_names.h"
#include "core/config.h"
#include "core/result.h"
#include "runtime/checkpoint.h"

namespace loom::runtime {

// Fills every piece of `target.params` from `dir` through `names` (the model type's map). Errors
// name the folder, the Hugging Face tensor and loom's parameter: a missing file or tensor, a
// shape the map does not expect, a dtype other than F32, BF16 or F16; a model type without a
// map, checkpoint.init_from.
Status load_hf_weights(const CheckpointTarget& target, const Config& config, const HfNameMap& names,
                       const std::filesystem::path& dir);

}  // namespace loom::runtime
