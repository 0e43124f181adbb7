// flat_range_boxes: every run of elements of every small shape is covered by its boxes exactly
// once, in order, each box contiguous in row-major order.
#include "checkpoint/flat_range.h"

#include <gtest/gtest.h>

namespace loom {
namespace {

TEST(FlatRange, BoxesCoverEveryRunExactlyOnceInOrder) {
  for (const Shape& shape : {Shape{7}, Shape{3, 5}, Shape{2, 3, 4}, Shape{4, 1, 3}, Shape{}}) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    for (int64_t b = 0; b <= n; ++b)
      for (int64_t e = b; e <= n; ++e) {
        int64_t next = b;  // the next element the boxes must start at
        for (const FlatBox& box : flat_range_boxes(shape, b, e)) {
          ASSERT_EQ(box.offset, next)
              << "shape rank " << shape.size() << " [" << b << "," << e << ")";
          ASSERT_EQ(box.ranges.size(), shape.size());
          // Row-major contiguity: after the first dimension whose range is not a single index,
          // every dimension is whole.
          int64_t flat = 0, count = 1;
          bool whole_from_here = false;
          for (size_t d = 0; d < shape.size(); ++d) {
            const auto [lo, hi] = box.ranges[d];
            ASSERT_LT(lo, hi);
            if (whole_from_here) {
              EXPECT_TRUE(lo == 0 && hi == shape[d]);
            }
            if (hi - lo > 1) whole_from_here = true;
            flat = flat * shape[d] + lo;
            count *= hi - lo;
          }
          EXPECT_EQ(flat, box.offset);
          next += count;
        }
        EXPECT_EQ(next, e) << "[" << b << "," << e << ")";
      }
  }
}

}  // namespace
}  // namespace loom
