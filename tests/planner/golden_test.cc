// Golden text dumps of GPT tiny under the standard plans: any change to how loom splits,
// places or stages the graph shows up here. LOOM_UPDATE_GOLDEN=1 rewrites the files.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "graph/dump.h"
#include "lower/equivalence.h"
#include "models/model.h"
#include "plan/plan.h"

namespace loom::planner {
namespace {

void check_golden(const std::string& name, const std::vector<std::string>& overrides,
                  int64_t world) {
  auto c = parse_config("model: {type: gpt, preset: tiny}\nbatch: {global: 4, micro: 2}\n",
                        "g.yaml", overrides);
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto g = loom::plan::planned_graph(*c, loom::plan::Registries{}, world);
  ASSERT_TRUE(g.ok()) << g.error().message;
  // The golden plan, lowered, is proven equal to one device (lower/equivalence.h).
  auto plan = loom::plan::make_plan(*c);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  Status proven = lower::prove_equivalent(plan->model, plan->file.graph, plan->file.lowered,
                                          plan->file.micro_batches);
  EXPECT_TRUE(proven.ok()) << proven.error().message;
  const std::string text = graph::dump(*g);
  const std::string path =
      std::string(LOOM_SOURCE_DIR) + "/tests/planner/golden/gpt-tiny-" + name + ".txt";
  if (const char* update = std::getenv("LOOM_UPDATE_GOLDEN");
      update && std::string(update) == "1") {
    std::ofstream(path) << text;
    return;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in) << "missing golden file " << path << " (run with LOOM_UPDATE_GOLDEN=1)";
  std::stringstream want;
  want << in.rdbuf();
  EXPECT_EQ(text, want.str()) << "dump of " << name
                              << " changed; if intended, rerun with LOOM_UPDATE_GOLDEN=1";
}

TEST(Golden, Dp2) { check_golden("dp2", {"parallel.dp=2"}, 2); }
TEST(Golden, Tp2) { check_golden("tp2", {"parallel.tp=2"}, 2); }
TEST(Golden, Tp2Sp) { check_golden("tp2-sp", {"parallel.tp=2", "parallel.sp=true"}, 2); }
TEST(Golden, Pp2) { check_golden("pp2", {"parallel.pp=2"}, 2); }
TEST(Golden, Dp2Tp2Pp2) {
  check_golden("dp2-tp2-pp2", {"parallel.dp=2", "parallel.tp=2", "parallel.pp=2"}, 8);
}

}  // namespace
}  // namespace loom::planner
