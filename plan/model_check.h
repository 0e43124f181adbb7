// The model type's reading of model.* and its checks of a config's split in space, without
// building the graph: what `loom config` validates and what build_model checks for several ranks.
#pragma once

#include "core/config.h"
#include "core/result.h"
#include "models/model.h"

namespace loom::plan {

// Errors name the key and where it came from.
Status check_model(const Config& config, const models::ModelRegistry& models);

}  // namespace loom::plan
