#include "lower/grad_bucketing.h"

#include <algorithm>

namespace loom::lower {

std::pair<int64_t, int64_t> BucketPlan::owned(size_t j, int64_t numel, int64_t m) const {
  if (segment == 0) return {0, numel};
  const int64_t begin = std::max(offset[j], m * segment);
  const int64_t end = std::min(offset[j] + numel, (m + 1) * segment);
  if (begin >= end) return {0, 0};
  return {begin - offset[j], end - offset[j]};
}

std::vector<std::vector<size_t>> group_in_order(const std::vector<std::vector<int64_t>>& keys) {
  std::vector<std::vector<int64_t>> seen;
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = std::find(seen.begin(), seen.end(), keys[i]);
    if (it == seen.end()) {
      seen.push_back(keys[i]);
      groups.emplace_back();
      it = seen.end() - 1;
    }
    groups[static_cast<size_t>(it - seen.begin())].push_back(i);
  }
  return groups;
}

std::vector<BucketPlan> plan_buckets(const std::vector<int64_t>& numel, int64_t element_bytes,
                                     int64_t bucket_bytes, int64_t members, bool zero1) {
  std::vector<BucketPlan> out(1);
  int64_t bytes = 0;
  for (size_t i = numel.size(); i-- > 0;) {
    const int64_t b = numel[i] * element_bytes;
    const int64_t cap = out.size() == 1 ? std::min(bucket_bytes, kFirstBucketBytes) : bucket_bytes;
    if (!out.back().params.empty() && bytes + b > cap) {
      out.emplace_back();
      bytes = 0;
    }
    out.back().params.push_back(i);
    bytes += b;
  }
  if (out.back().params.empty()) out.pop_back();
  for (BucketPlan& bucket : out) {
    bucket.members = members;
    for (size_t i : bucket.params) {
      bucket.offset.push_back(bucket.elements);
      bucket.elements += numel[i];
    }
    if (zero1 && members > 1) bucket.segment = (bucket.elements + members - 1) / members;
  }
  return out;
}

}  // namespace loom::lower
