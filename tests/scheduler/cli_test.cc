// `loom schedule` end to end: exit codes, the JSON object, the files it writes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "scheduler/csv.h"

namespace {

struct CommandRun {
  int code;
  std::string out;
};

CommandRun loom_schedule(const std::string& flags) {
  std::string cmd = std::string(LOOM_BINARY_DIR) + "/bin/loom schedule " + flags + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ScheduleCommand, JsonForPredefined) {
  CommandRun r = loom_schedule("--kind interleaved --stages 4 --micro-batches 8 --chunks 2 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_NEAR(j["makespan"].get<double>(), (2 * 8 + 3) * 3.0 / 2, 1e-9);
  EXPECT_NEAR(j["bubble_ratio"].get<double>(), 3.0 / 19, 1e-9);
  EXPECT_EQ(j["peak_memory"].size(), 4u);
  EXPECT_TRUE(j.contains("search_time_s"));
}

TEST(ScheduleCommand, SearchWritesCsvSvgTrace) {
  const std::string dir = std::string(LOOM_BINARY_DIR) + "/";
  CommandRun r =
      loom_schedule("--kind search --stages 4 --micro-batches 8 --mem-limit 4 --json --csv " + dir +
                    "s.csv --svg " + dir + "s.svg --trace " + dir + "s.json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["makespan"].get<double>(), 33);  // 1F1B's: (m + p - 1)(t_f + t_b)
  EXPECT_EQ(j["period"].get<double>(), 3);
  EXPECT_TRUE(loom::sched::from_csv(read(dir + "s.csv")).ok());
  EXPECT_NE(read(dir + "s.svg").find("<svg"), std::string::npos);
  EXPECT_NO_THROW(nlohmann::json::parse(read(dir + "s.json")));
  CommandRun placed = loom_schedule("--kind search --placement " + std::string(LOOM_SOURCE_DIR) +
                                    "/configs/placements/x_shape.yaml --micro-batches 8");
  EXPECT_EQ(placed.code, 0) << placed.out;
  EXPECT_NE(placed.out.find("period"), std::string::npos);
}

TEST(ScheduleCommand, SearchesTheSplitVShapeNoWorseThanZbH1) {
  const std::string costs = " --stages 4 --micro-batches 8 --fwd 1 --bwd 1 --wgrad 1 --json";
  CommandRun searched = loom_schedule("--kind search --placement v-split" + costs);
  ASSERT_EQ(searched.code, 0) << searched.out;
  CommandRun zb = loom_schedule("--kind zb-h1" + costs);
  ASSERT_EQ(zb.code, 0) << zb.out;
  auto s = nlohmann::json::parse(searched.out), z = nlohmann::json::parse(zb.out);
  EXPECT_LE(s["makespan"].get<double>(), z["makespan"].get<double>() + 1e-9);
  EXPECT_EQ(s["period"].get<double>(), 3);  // F + I + W: no bubble in the steady state
  for (const auto& peak : s["peak_memory"]) EXPECT_LE(peak.get<double>(), 4 + 1e-9);
}

TEST(ScheduleCommand, BadInputIsOneClearMessageAndExit2) {
  struct Case {
    const char* flags;
    const char* says;
  };
  for (const auto& c :
       {Case{"--kind 1f1b --stages 4 --micro-batches 8 --bogus", "--bogus"},
        Case{"--kind 1fb1 --stages 4 --micro-batches 8", "did you mean '1f1b'"},
        Case{"--kind 1f1b --stages four --micro-batches 8", "--stages"},
        Case{"--kind chimera --stages 3 --micro-batches 4", "even number of stages, got 3"},
        Case{"--kind interleaved --stages 4 --micro-batches 6 --chunks 2", "multiple of p"},
        Case{"--kind search --placement /nonexistent.yaml --micro-batches 4", "/nonexistent.yaml"},
        Case{"--kind search --stages 4 --micro-batches 4 --mem-limit 0.5", "memory limit"},
        Case{"--kind search --placement v-split --micro-batches 4", "needs --stages"},
        Case{"--stages 4 --micro-batches 4", "--kind"}}) {
    CommandRun r = loom_schedule(c.flags);
    EXPECT_EQ(r.code, 2) << c.flags << "\n" << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.flags << "\n" << r.out;
    EXPECT_EQ(r.out.find("internal error"), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  }
}

}  // namespace
