#include "core/result.h"

#include <gtest/gtest.h>

namespace loom {
namespace {

Result<int> half(int x) {
  if (x % 2) return Error::at("x", "odd: " + std::to_string(x));
  return x / 2;
}

Result<int> quarter(int x) {
  LOOM_ASSIGN_OR_RETURN(int h, half(x));
  return half(h);
}

Status check_even(int x) {
  LOOM_TRY(half(x));
  return Status::success();
}

TEST(Result, ValueAndError) {
  EXPECT_EQ(*half(8), 4);
  auto r = half(3);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().key, "x");
  EXPECT_EQ(r.error().to_string(), "x: odd: 3");
}

TEST(Result, PropagatesThroughMacros) {
  EXPECT_EQ(*quarter(8), 2);
  EXPECT_EQ(quarter(6).error().message, "odd: 3");
  EXPECT_TRUE(check_even(4).ok());
  EXPECT_FALSE(check_even(5).ok());
}

TEST(Result, ValueOfErrorIsAnInternalError) {
  auto r = half(1);
  EXPECT_THROW((void)r.value(), InternalError);
}

TEST(Check, CarriesContext) {
  try {
    int n = 3;
    LOOM_CHECK(n == 4) << "n is " << n;
    FAIL() << "check did not throw";
  } catch (const InternalError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("n == 4"), std::string::npos);
    EXPECT_NE(what.find("n is 3"), std::string::npos);
  }
}

}  // namespace
}  // namespace loom
