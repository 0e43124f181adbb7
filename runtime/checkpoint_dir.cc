#include "runtime/checkpoint_dir.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "checkpoint/manifest.h"
#include "core/durable_file.h"

namespace loom::runtime {
namespace {

namespace fs = std::filesystem;

Error dir_error(const std::string& message) {
  return Error::at("checkpoint.dir", "checkpoint.dir: " + message);
}

// The id recorded in `dir`, or "" when it has none.
std::string run_id_in(const fs::path& dir) {
  std::error_code ec;
  if (dir.empty() || !fs::is_regular_file(dir / CheckpointDir::kRunFile, ec)) return "";
  auto text = read_whole_file(dir / CheckpointDir::kRunFile);
  if (!text.ok()) return "";
  std::string id = *text;
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

std::string new_run_id() {
  std::random_device device;
  const uint64_t now = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch() /
                                             std::chrono::nanoseconds(1));
  const uint64_t id = (static_cast<uint64_t>(device()) << 32 ^ device()) ^ now ^
                      (static_cast<uint64_t>(::getpid()) << 40);
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(id));
  return buf;
}

// The step_N entries of `root` (complete or not), by name.
std::vector<fs::path> step_entries(const fs::path& root) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
    if (parse_checkpoint_dir_name(it->path().filename().string())) out.push_back(it->path());
  std::sort(out.begin(), out.end());
  return out;
}

bool same_dir(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec);
}

// Whether `path` lies in `dir` (or is it).
bool within(const fs::path& path, const fs::path& dir) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(path, ec), d = fs::weakly_canonical(dir, ec);
  auto mismatch = std::mismatch(d.begin(), d.end(), p.begin(), p.end());
  return mismatch.first == d.end() ||
         (std::next(mismatch.first) == d.end() && mismatch.first->empty());  // "dir/" names dir
}

Error foreign_checkpoints(const fs::path& root, const std::vector<fs::path>& steps,
                          const std::string& owner) {
  std::string names;
  for (size_t i = 0; i < steps.size() && i < 3; ++i)
    names += (i ? ", " : "") + steps[i].filename().string();
  if (steps.size() > 3) names += ", ...";
  return dir_error("'" + root.string() + "' holds the checkpoints of another run (" + names +
                   (owner.empty() ? std::string() : "; run " + owner) +
                   "): a new run does not write, prune or resume among them; resume that run "
                   "(checkpoint.resume=latest), give this run another checkpoint.dir, or remove "
                   "them (run.overwrite=true does when they lie in run.output_dir)");
}

}  // namespace

fs::path checkpoint_root(const Config& config) {
  if (!config.checkpoint.dir.empty()) return config.checkpoint.dir;
  return fs::path(config.run.output_dir) / "checkpoints";
}

Status check_inside(const fs::path& root, const fs::path& path) {
  std::error_code ec;
  if (!fs::is_symlink(fs::symlink_status(path, ec))) return Status::success();
  const fs::path target = fs::weakly_canonical(path, ec);
  if (!ec && target.parent_path() == fs::weakly_canonical(root, ec) && !ec)
    return Status::success();
  return dir_error("'" + path.string() + "' is a symbolic link to '" +
                   fs::read_symlink(path, ec).string() + "', outside '" + root.string() +
                   "': loom does not write or delete through it (remove the link)");
}

Result<std::unique_ptr<CheckpointDir>> CheckpointDir::claim(const Config& config,
                                                            const fs::path& resumed) {
  const fs::path root = checkpoint_root(config);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return dir_error("cannot create '" + root.string() + "': " + ec.message());
  auto lock = RunDirLock::acquire(root, kLockFile);
  if (!lock.ok()) return dir_error(lock.error().message);
  const std::vector<fs::path> steps = step_entries(root);
  for (const fs::path& step : steps) LOOM_TRY(check_inside(root, step));

  // This run's id: the run's whose checkpoint it resumed (checkpoint.resume latest continues
  // the directory's run, even from step 0: a restart before the first checkpoint), else a new
  // one.
  const std::string owner = run_id_in(root);
  const bool continues = config.checkpoint.resume == "latest" ||
                         (!resumed.empty() && same_dir(resumed.parent_path(), root));
  const std::string id = continues && !owner.empty() ? owner : run_id_in(resumed.parent_path());
  const bool foreign = !steps.empty() && (owner.empty() ? !continues : owner != id);
  if (foreign) {
    if (!(config.run.overwrite && resumed.empty() && within(root, config.run.output_dir)))
      return foreign_checkpoints(root, steps, owner);
    for (const fs::path& step : steps) fs::remove_all(step, ec);
    if (ec)
      return dir_error("cannot remove '" + root.string() + "''s checkpoints: " + ec.message());
  }
  const std::string ours = id.empty() ? new_run_id() : id;
  if (ours != owner) {
    if (Status s = write_file_durably(root / kRunFile, ours + "\n"); !s.ok())
      return dir_error(s.error().message);
  }
  return std::unique_ptr<CheckpointDir>(new CheckpointDir(std::move(*lock), ours));
}

}  // namespace loom::runtime
