#include "launch/config_file.h"

#include <filesystem>
#include <system_error>

#include "models/hf_config.h"

namespace loom::cli {

Result<Config> load_config_file(const std::string& path,
                                const std::vector<std::string>& overrides) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path inside = fs::path(path) / "config.yaml";
    const std::string hint = fs::is_regular_file(inside, ec)
                                 ? " (did you mean '" + inside.string() + "'?)"
                                 : "; give the YAML config file";
    return Error::at(path, path + ": is a directory, not a config file" + hint);
  }
  LOOM_ASSIGN_OR_RETURN(Config config, load_config(path, overrides));
  LOOM_TRY(models::apply_from_hf(config));
  return config;
}

}  // namespace loom::cli
