#include "checkpoint/flat_range.h"

#include <algorithm>

namespace loom {
namespace {

// Boxes of [begin, end) within the sub-tensor of dims [d, n) at flat offset `base`, with the
// ranges of dims [0, d) given by `prefix`.
void boxes(const Shape& shape, size_t d, int64_t begin, int64_t end, int64_t base,
           const SliceRanges& prefix, std::vector<FlatBox>& out) {
  if (begin >= end) return;
  if (d == shape.size()) {  // a scalar
    out.push_back({base, prefix});
    return;
  }
  int64_t inner = 1;
  for (size_t k = d + 1; k < shape.size(); ++k) inner *= shape[k];
  auto whole_rest = [&](int64_t r0, int64_t r1) {
    SliceRanges r = prefix;
    r.emplace_back(r0, r1);
    for (size_t k = d + 1; k < shape.size(); ++k) r.emplace_back(0, shape[k]);
    out.push_back({base + r0 * inner, r});
  };
  auto partial_row = [&](int64_t row, int64_t b, int64_t e) {
    SliceRanges r = prefix;
    r.emplace_back(row, row + 1);
    boxes(shape, d + 1, b, e, base + row * inner, r, out);
  };
  int64_t row = begin / inner;
  if (begin % inner != 0) {  // the first row's tail
    partial_row(row, begin % inner, std::min(end - row * inner, inner));
    ++row;
  }
  const int64_t last = end / inner;  // rows before it are whole (from `row` on)
  if (row < last) whole_rest(row, last);
  if (end % inner != 0 && last >= row && last * inner < end && last * inner >= begin)
    partial_row(last, 0, end - last * inner);
}

}  // namespace

std::vector<FlatBox> flat_range_boxes(const Shape& shape, int64_t begin, int64_t end) {
  std::vector<FlatBox> out;
  boxes(shape, 0, begin, end, 0, {}, out);
  return out;
}

}  // namespace loom
