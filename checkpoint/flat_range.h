// A run of elements of a tensor in row-major order as rectangular regions, so a piece's optimizer
// state split at any element (parallel.zero 1) is stored as ordinary slices that any plan reads.
// LibTorch-free.
#pragma once

#include <cstdint>
#include <vector>

#include "checkpoint/manifest.h"
#include "core/shape.h"

namespace loom {

struct FlatBox {
  int64_t offset = 0;  // of its first element in the flattened tensor
  SliceRanges ranges;  // [start, end) per dimension; its elements are contiguous in that order
};

// The boxes covering elements [begin, end) of a tensor of `shape`, in order: at most two
// partial runs per dimension around one block of whole rows.
std::vector<FlatBox> flat_range_boxes(const Shape& shape, int64_t begin, int64_t end);

}  // namespace loom
