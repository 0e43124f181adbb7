#include "launch/config_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
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

Status check_run_asks(const Config& config) {
  for (int64_t step : config.logging.trace_steps)
    if (step > config.run.steps)
      return config.error("logging.trace_steps",
                          "step " + std::to_string(step) + " is beyond the run (run.steps " +
                              std::to_string(config.run.steps) + "), so it would never be traced");
  return Status::success();
}

Status check_writable_dir(const std::string& dir, const std::string& key) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // The first folder that does not exist yet: the probe removes what it made, from there down.
  fs::path made;
  for (fs::path p = fs::absolute(dir, ec); !p.empty(); p = p.parent_path()) {
    if (fs::exists(p, ec)) break;
    made = p;
    if (p == p.parent_path()) break;
  }
  auto refuse = [&](const std::string& why) {
    return Error::at(key, "cannot write checkpoints to '" + dir + "': " + why);
  };
  if (!made.empty() && !fs::create_directories(dir, ec)) return refuse(ec.message());
  if (!fs::is_directory(dir, ec)) return refuse("it is not a directory");
  const fs::path probe = fs::path(dir) / (".loom-write-probe-" + std::to_string(getpid()));
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  const int err = errno;
  if (fd >= 0) {
    close(fd);
    fs::remove(probe, ec);
  }
  if (!made.empty()) fs::remove_all(made, ec);
  if (fd < 0) return refuse(std::strerror(err));
  return Status::success();
}

Status check_launcher_env() {
  auto read = [](const char* name, long long lo, long long* out) -> Status {
    const char* v = std::getenv(name);
    if (v == nullptr) return Status::success();
    char* end = nullptr;
    errno = 0;
    const long long parsed = std::strtoll(v, &end, 10);
    if (*v == '\0' || *end != '\0' || errno != 0 || parsed < lo || parsed > (1 << 20))
      return Error::at(name, std::string(name) + "=" + v + " is not valid: expected an integer " +
                                 (lo == 0 ? ">= 0" : ">= 1") +
                                 " (the launcher sets it: loomrun, torchrun)");
    *out = parsed;
    return Status::success();
  };
  long long size = -1, rank = -1, local = -1, local_size = -1;
  LOOM_TRY(read("WORLD_SIZE", 1, &size));
  LOOM_TRY(read("RANK", 0, &rank));
  LOOM_TRY(read("LOCAL_RANK", 0, &local));
  LOOM_TRY(read("LOCAL_WORLD_SIZE", 1, &local_size));
  if (size > 0 && rank >= size)
    return Error::at("RANK", "RANK=" + std::to_string(rank) +
                                 " is not below WORLD_SIZE=" + std::to_string(size));
  return Status::success();
}

}  // namespace loom::cli
