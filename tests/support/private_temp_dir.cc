// Every test process writes its files under a directory of its own.
//
// ctest runs each test of a binary as its own process, several at once, and many tests name
// their files under ::testing::TempDir() by a fixed name shared with the binary's other tests:
// two processes writing the same /tmp file would read each other's half-written bytes. Before
// main, this sets TEST_TMPDIR (which ::testing::TempDir() returns) to a fresh directory, removed
// when the process ends with every test passed and kept, named on stderr, when one failed.
// A child process inherits the directory and leaves it to its parent.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

namespace {

constexpr const char* kOwnerVariable = "LOOM_TEST_TMPDIR_OWNER";

class PrivateTempDir {
 public:
  PrivateTempDir() {
    // Constructed before this object, so that it is destroyed after it.
    ::testing::UnitTest::GetInstance();
    if (std::getenv(kOwnerVariable) != nullptr) return;  // a child: the parent's directory
    std::string pattern = ::testing::TempDir() + "loom-test-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::fprintf(stderr, "loom tests: cannot make a directory %s: %s\n", pattern.c_str(),
                   std::strerror(errno));
      std::exit(2);
    }
    dir_ = pattern;
    owner_ = getpid();
    setenv("TEST_TMPDIR", dir_.c_str(), 1);
    setenv(kOwnerVariable, std::to_string(owner_).c_str(), 1);
  }

  ~PrivateTempDir() {
    if (dir_.empty() || getpid() != owner_) return;  // a forked child leaves it alone
    if (::testing::UnitTest::GetInstance()->Failed()) {
      std::fprintf(stderr, "loom tests: files kept in %s\n", dir_.c_str());
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  PrivateTempDir(const PrivateTempDir&) = delete;
  PrivateTempDir& operator=(const PrivateTempDir&) = delete;

 private:
  std::string dir_;
  pid_t owner_ = 0;
};

const PrivateTempDir private_temp_dir;

}  // namespace
