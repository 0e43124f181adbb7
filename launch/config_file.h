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

// What a run asks beyond what each key alone can refuse: logging.trace_steps within run.steps.
Status check_run_asks(const Config& config);

// Whether a file can be made in `dir` (made for the probe if missing, then removed again with
// the probe, so that nothing is left behind); the error names `key` and the folder.
Status check_writable_dir(const std::string& dir, const std::string& key);

// The launcher's variables (WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE), when set, are
// integers in range, so that a typo is refused instead of read as a world of one.
Status check_launcher_env();

}  // namespace loom::cli
