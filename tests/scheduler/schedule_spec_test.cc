// parallel.schedule as a value: every name parses into the kind it says and prints back; an
// unknown one is refused with the closest name.
#include "scheduler/schedule_spec.h"

#include <gtest/gtest.h>

namespace loom::sched {
namespace {

TEST(ScheduleSpec, EveryNameRoundTrips) {
  for (const std::string& name : ScheduleSpec::names()) {
    auto spec = ScheduleSpec::parse(name, "order.csv");
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.error().message;
    EXPECT_EQ(spec->name(), name);
  }
}

TEST(ScheduleSpec, TheVariantSaysWhatRuns) {
  auto zb = ScheduleSpec::parse("zb-h1");
  ASSERT_TRUE(zb.ok());
  ASSERT_NE(zb->as_predefined(), nullptr);
  EXPECT_TRUE(zb->is(ScheduleKind::kZbH1));
  EXPECT_EQ(zb->as_searched(), nullptr);

  auto search = ScheduleSpec::parse("search");
  auto search_zb = ScheduleSpec::parse("search-zb");
  ASSERT_TRUE(search.ok() && search_zb.ok());
  ASSERT_NE(search->as_searched(), nullptr);
  EXPECT_FALSE(search->as_searched()->split_backward);
  EXPECT_TRUE(search_zb->as_searched()->split_backward);
  EXPECT_FALSE(*search == *search_zb);

  auto csv = ScheduleSpec::parse("csv", "runs/order.csv");
  ASSERT_TRUE(csv.ok());
  ASSERT_NE(csv->as_imported(), nullptr);
  EXPECT_EQ(csv->as_imported()->csv, "runs/order.csv");
  EXPECT_FALSE(*csv == ScheduleSpec::imported("other.csv"));
}

TEST(ScheduleSpec, AnUnknownNameSaysTheClosest) {
  auto spec = ScheduleSpec::parse("1f1bb");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.error().message.find("'1f1b'"), std::string::npos) << spec.error().message;
  EXPECT_NE(spec.error().message.find("search-zb"), std::string::npos) << spec.error().message;
}

}  // namespace
}  // namespace loom::sched
