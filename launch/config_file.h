// The CONFIG argument of every `loom` command read the same way: core/config.h's load_config,
// after refusing what is no config file at all, so the message says what was given.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "core/result.h"

namespace loom::cli {

// load_config(path, overrides), model.from_hf applied (models/hf_config.h), except that a directory
// is refused as one (it would otherwise read as an empty config), pointing at its config.yaml when
// it has one (a run directory).
Result<Config> load_config_file(const std::string& path, const std::vector<std::string>& overrides);

}  // namespace loom::cli
