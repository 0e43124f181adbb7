// `loom plan` for the AlphaFold2 Evoformer at paper size (48 blocks, crop 256) on 16 virtual
// ranks: DAP 16, and DAP 4 x 4 pipeline stages. The plan completes, reports memory for every
// rank, and the programs carry the all-to-alls the lowering found.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace {

namespace fs = std::filesystem;

struct Outcome {
  int code;
  std::string output;
};

Outcome run(const std::string& args) {
  std::string cmd = std::string(LOOM_BINARY_DIR) + "/bin/loom " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  int status = pclose(pipe);
  return Outcome{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void expect_plan(const std::string& name, const std::string& overrides, const std::string& mesh) {
  const fs::path dir = fs::path(testing::TempDir()) / ("loom_evoformer_plan_" + name);
  fs::remove_all(dir);
  const std::string config = std::string(LOOM_SOURCE_DIR) + "/configs/alphafold2.yaml";
  Outcome r = run("plan " + config + " " + overrides + " --out " + dir.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("plan: evoformer alphafold2 on 16 ranks (" + mesh + ")"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("est. step time"), std::string::npos) << r.output;
  // One summary row per rank, each with an estimated peak memory in GiB or MiB.
  std::istringstream summary(read(dir / "summary.txt"));
  std::string line;
  int rows = 0;
  while (std::getline(summary, line)) {
    // Rank rows start with the rank number; the header lines do not.
    const size_t first = line.find_first_not_of(' ');
    if (first == std::string::npos || !std::isdigit(static_cast<unsigned char>(line[first])))
      continue;
    EXPECT_TRUE(line.find("GiB") != std::string::npos || line.find("MiB") != std::string::npos)
        << line;
    EXPECT_EQ(std::stoi(line), rows) << line;
    ++rows;
  }
  EXPECT_EQ(rows, 16) << read(dir / "summary.txt");
  for (int rank : {0, 15}) {
    const std::string program = read(dir / "programs" / ("rank_" + std::to_string(rank) + ".txt"));
    EXPECT_NE(program.find("all_to_all"), std::string::npos) << "rank " << rank;
  }
}

TEST(EvoformerPlanCli, AlphaFold2Dap16) {
  expect_plan("dap16", "parallel.tp=16", "dp 1 x tp 16 x pp 1");
}

TEST(EvoformerPlanCli, AlphaFold2Dap4Pp4) {
  expect_plan("dap4pp4", "parallel.tp=4 parallel.pp=4 batch.global=4", "dp 1 x tp 4 x pp 4");
}

}  // namespace
