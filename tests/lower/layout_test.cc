#include "lower/layout.h"

#include <gtest/gtest.h>

namespace loom::lower {
namespace {

std::vector<DeviceId> devs(std::initializer_list<int> ids) {
  std::vector<DeviceId> out;
  for (int i : ids) out.push_back(DeviceId(i));
  return out;
}

TEST(Layout, PiecesFollowMixedRadixOrder) {
  Layout l;
  l.r = 2;
  l.v = 1;
  l.d = {1, 2};
  l.devices = devs({4, 5, 6, 7});
  ASSERT_TRUE(l.validate().ok());
  Shape shape{4, 6};
  EXPECT_EQ(l.piece(0, TensorId(0), shape).ranges_string(), "[0:4, 0:3]");
  EXPECT_EQ(l.piece(1, TensorId(0), shape).ranges_string(), "[0:4, 3:6]");
  EXPECT_EQ(l.piece(2, TensorId(0), shape).ranges_string(), "[0:4, 0:3]");
  EXPECT_EQ(l.to_string(), "R2 V1 D[1,2] @ [4,5,6,7]");
  Layout p = Layout::partial(2, devs({0, 1}));
  EXPECT_EQ(p.piece(1, TensorId(0), shape).ranges_string(), "[0:4, 0:6]/v1of2");
}

TEST(Layout, RecognisedFromPieces) {
  Shape shape{4, 6};
  Layout l;
  l.r = 2;
  l.d = {2, 1};
  l.devices = devs({3, 1, 0, 2});
  std::vector<std::pair<DeviceId, graph::SubTensor>> pieces;
  for (int64_t p = 0; p < 4; ++p) pieces.push_back({l.devices[p], l.piece(p, TensorId(0), shape)});
  auto back = layout_of(pieces, shape);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_TRUE(back->same_factors(l));
  for (int64_t p = 0; p < 4; ++p)
    EXPECT_EQ(
        back->piece(p, TensorId(0), shape),
        l.piece(std::find(l.devices.begin(), l.devices.end(), back->devices[p]) - l.devices.begin(),
                TensorId(0), shape));
}

TEST(Layout, Rejections) {
  Layout l = Layout::split(2, 0, devs({0, 1, 2}));
  Shape shape{4, 6};
  EXPECT_FALSE(l.validate(&shape).ok());
  Layout dup = Layout::replicated(1, devs({0, 0}));
  EXPECT_FALSE(dup.validate().ok());
  graph::SubTensor a, b;
  a.tensor = b.tensor = TensorId(0);
  a.ranges = {{0, 3}, {0, 6}};
  b.ranges = {{3, 4}, {0, 6}};
  EXPECT_FALSE(layout_of({{DeviceId(0), a}, {DeviceId(1), b}}, Shape{4, 6}).ok());
}

}  // namespace
}  // namespace loom::lower
