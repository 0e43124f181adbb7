// The embedding example as a user builds it: `cmake --install` loom into a prefix, configure and
// build examples/embed against it with find_package(loom), then train its custom-op model on one
// process and on two tensor-parallel ranks under loomrun: the losses must be equal.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

int sh(const std::string& cmd, const fs::path& log) {
  const int status =
      std::system(("timeout 240 bash -c '" + cmd + "' > " + log.string() + " 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<double> losses(const fs::path& p) {
  std::ifstream in(p);
  std::vector<double> out;
  for (double v; in >> v;) out.push_back(v);
  return out;
}

TEST(Embed, ExampleBuildsAgainstTheInstalledPackageAndTrainsWithTp2) {
  const fs::path bin(LOOM_BINARY_DIR), dir = bin / "embed_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string cmake = LOOM_CMAKE, prefix = (dir / "prefix").string();
  ASSERT_EQ(sh(cmake + " --install " + bin.string() + " --prefix " + prefix, dir / "install.log"),
            0)
      << read(dir / "install.log");
  ASSERT_TRUE(fs::exists(dir / "prefix" / "lib" / "cmake" / "loom" / "loomConfig.cmake"));
  ASSERT_TRUE(fs::exists(dir / "prefix" / "include" / "loom" / "loom.h"));
  const std::string build = (dir / "build").string();
  ASSERT_EQ(sh(cmake + " -G \"" + std::string(LOOM_CMAKE_GENERATOR) + "\" -S " + LOOM_SOURCE_DIR +
                   "/examples/embed -B " + build +
                   " -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=" + prefix + " && " + cmake +
                   " --build " + build,
               dir / "build.log"),
            0)
      << read(dir / "build.log");

  const std::string app = build + "/embed_train " + LOOM_SOURCE_DIR + "/examples/embed/embed.yaml";
  ASSERT_EQ(sh("OMP_NUM_THREADS=1 " + app + " parallel.tp=1 --losses " + (dir / "one.txt").string(),
               dir / "one.log"),
            0)
      << read(dir / "one.log");
  ASSERT_EQ(sh(prefix + "/bin/loomrun --nproc-per-node 2 --standalone " + app + " --losses " +
                   (dir / "two.txt").string() + " --plan-dir " + (dir / "plan").string(),
               dir / "two.log"),
            0)
      << read(dir / "two.log");
  const auto one = losses(dir / "one.txt"), two = losses(dir / "two.txt");
  ASSERT_EQ(one.size(), 8u);
  ASSERT_EQ(two.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i)
    EXPECT_NEAR(two[i], one[i], 1e-5 * one[i]) << "step " << i + 1;
  EXPECT_LT(one.back(), one.front() - 0.1) << "the loss did not fall";
  // The custom op was split over the two ranks (its annotation allows it), not replicated.
  EXPECT_NE(read(dir / "plan" / "programs" / "rank_1.txt").find("swish[1/2]"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir / "plan" / "plan.json"));
}

}  // namespace
