#include "planner/mesh.h"

#include <gtest/gtest.h>

namespace loom::planner {
namespace {

TEST(DeviceMesh, TensorParallelRanksAreNeighbours) {
  auto mesh = DeviceMesh::make(2, 2, 2);
  ASSERT_TRUE(mesh.ok());
  EXPECT_EQ(mesh->size(), 8);
  EXPECT_EQ(mesh->rank({0, 0, 1}), Rank(1));
  EXPECT_EQ(mesh->rank({1, 0, 0}), Rank(2));
  EXPECT_EQ(mesh->rank({0, 1, 0}), Rank(4));
  for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(mesh->rank(mesh->coord(Rank(r))), Rank(r));
  EXPECT_EQ(mesh->tp_group({1, 1, 0}), (std::vector<Rank>{Rank(6), Rank(7)}));
  EXPECT_EQ(mesh->dp_group({0, 1, 1}), (std::vector<Rank>{Rank(5), Rank(7)}));
  EXPECT_EQ(mesh->pp_group({1, 0, 1}), (std::vector<Rank>{Rank(3), Rank(7)}));
  EXPECT_EQ(mesh->to_string(), "dp2 x pp2 x tp2 (8 ranks)");
  EXPECT_FALSE(DeviceMesh::make(0, 1, 1).ok());
}

}  // namespace
}  // namespace loom::planner
