#include "core/strings.h"

#include <gtest/gtest.h>

namespace loom {
namespace {

TEST(Strings, SplitKeepsEmptyFields) {
  EXPECT_EQ(split("a,,b", ','), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(split("", ','), (std::vector<std::string>{""}));
}

TEST(Strings, Trim) { EXPECT_EQ(trim("  a b \n"), "a b"); }

TEST(Strings, EditDistance) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
}

TEST(Strings, ClosestMatchOnlyForPlausibleTypos) {
  std::vector<std::string> names = {"parallel.tp", "parallel.pp", "batch.micro"};
  EXPECT_EQ(closest_match("batch.mciro", names), "batch.micro");
  EXPECT_EQ(closest_match("completely.different", names), "");
}

}  // namespace
}  // namespace loom
