// The run directory's pieces on their own: metrics.jsonl's rows on a resume and its write
// failures, and the lock that keeps a second run out.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/metrics_file.h"
#include "runtime/run_lock.h"

namespace loom::runtime {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir() {
  fs::path d = fs::path(testing::TempDir()) /
               ("loom_run_output_" +
                std::string(testing::UnitTest::GetInstance()->current_test_info()->name()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(MetricsFile, AResumeDropsTheRowsAfterItsStepAndATornLastRow) {
  const fs::path file = fresh_dir() / "metrics.jsonl";
  std::ofstream(file) << "{\"step\":1}\n{\"step\":2}\nnot json\n{\"step\":3}\n{\"step\":2}\n"
                         "{\"note\":\"kept\"}\n{\"step\":3,\"lo";
  auto m = MetricsFile::resume(file, 2);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ((*m)->dropped_rows(), 2);
  ASSERT_TRUE((*m)->append("{\"step\":3}").ok());
  ASSERT_TRUE((*m)->close().ok());
  EXPECT_EQ(read(file),
            "{\"step\":1}\n{\"step\":2}\nnot json\n{\"step\":2}\n{\"note\":\"kept\"}\n"
            "{\"step\":3}\n");
}

TEST(MetricsFile, AResumeWithNothingAfterItsStepLeavesTheFileAlone) {
  const fs::path dir = fresh_dir();
  const fs::path file = dir / "metrics.jsonl";
  auto missing = MetricsFile::resume(file, 4);  // resumed into a new directory
  ASSERT_TRUE(missing.ok()) << missing.error().message;
  EXPECT_EQ((*missing)->dropped_rows(), 0);
  ASSERT_TRUE((*missing)->append("{\"step\":5}").ok());
  ASSERT_TRUE((*missing)->close().ok());
  auto again = MetricsFile::resume(file, 5);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->dropped_rows(), 0);
  EXPECT_EQ(read(file), "{\"step\":5}\n");
}

// /dev/full: every write fails with ENOSPC, as on a full file system.
TEST(MetricsFile, AWriteThatFailsIsAnErrorNamingTheFile) {
  const fs::path file = fresh_dir() / "metrics.jsonl";
  fs::create_symlink("/dev/full", file);
  for (bool resumed : {false, true}) {
    auto m = resumed ? MetricsFile::resume(file, 3) : MetricsFile::create(file);
    ASSERT_TRUE(m.ok()) << m.error().message;
    Status s = (*m)->append("{\"step\":4}");
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().message, "cannot write '" + file.string() + "': No space left on device");
  }
}

TEST(RunDirLock, ASecondLockIsRefusedNamingTheDirectoryAndTheHolder) {
  const fs::path dir = fresh_dir();
  {
    auto first = RunDirLock::acquire(dir);
    ASSERT_TRUE(first.ok()) << first.error().message;
    // flock belongs to the open file, so a second open in this process conflicts as another
    // process's would.
    auto second = RunDirLock::acquire(dir);
    ASSERT_FALSE(second.ok());
    EXPECT_NE(second.error().message.find("'" + dir.string() + "' is in use by another run (pid " +
                                          std::to_string(getpid()) + ")"),
              std::string::npos)
        << second.error().message;
  }
  EXPECT_TRUE(RunDirLock::acquire(dir).ok()) << "the lock outlived its holder";
}

TEST(RunDirLock, ADirectoryThatIsMissingIsAnErrorNamingTheLockFile) {
  const fs::path dir = fresh_dir() / "missing";
  auto lock = RunDirLock::acquire(dir);
  ASSERT_FALSE(lock.ok());
  EXPECT_NE(lock.error().message.find((dir / RunDirLock::kFileName).string()), std::string::npos)
      << lock.error().message;
}

// run.overwrite clears a run directory whole but for its lock and what it is told to keep, and
// removes a link itself, never what the link leads to.
TEST(RunDir, ClearingKeepsTheLockAndNeverFollowsALink) {
  const fs::path dir = fresh_dir();
  const fs::path outside = dir.string() + "_outside";
  fs::remove_all(outside);
  fs::create_directories(outside);
  std::ofstream(outside / "precious") << "not the run's";
  auto lock = RunDirLock::acquire(dir);
  ASSERT_TRUE(lock.ok());
  std::ofstream(dir / "metrics.jsonl") << "{\"step\":1}\n";
  fs::create_directories(dir / "checkpoints" / "step_00000001");
  fs::create_directories(dir / "kept");
  fs::create_directory_symlink(outside, dir / "link");
  EXPECT_TRUE(holds_run(dir));
  ASSERT_TRUE(clear_run_dir(dir, {dir / "kept"}).ok());
  EXPECT_FALSE(holds_run(dir));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{RunDirLock::kFileName, "kept"}));
  EXPECT_EQ(read(outside / "precious"), "not the run's");
}

}  // namespace
}  // namespace loom::runtime
