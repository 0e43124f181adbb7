// How the gradients of parameter pieces held by several ranks are bucketed and, under
// parallel.zero 1, which part of each bucket a member of the group owns: the runtime's buckets
// (runtime/grad_buckets.h) and the plan's memory estimate both come from here.
// LibTorch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace loom::lower {

// The first bucket holds at most this much (as DDP's): it is reduced while backward goes on.
constexpr int64_t kFirstBucketBytes = int64_t{1} << 20;

struct BucketPlan {
  std::vector<size_t> params;   // indices into the group's pieces, in bucket order
  std::vector<int64_t> offset;  // per entry of `params`: where it starts in the flat buffer
  int64_t elements = 0;         // of the pieces, back to back
  // ZeRO-1: the flat buffer is `members` equal segments (the last padded); member j owns
  // elements [j x segment, (j + 1) x segment) and updates exactly those. 0 otherwise.
  int64_t segment = 0;
  int64_t members = 1;
  int64_t buffer_elements() const { return segment > 0 ? segment * members : elements; }
  // The part [begin, end) of entry `j`'s piece (flattened) that member `m` owns under ZeRO-1
  // (empty when none); the whole piece without ZeRO-1.
  std::pair<int64_t, int64_t> owned(size_t j, int64_t numel, int64_t m) const;
};

// Indices of `keys` (the group of ranks each shared piece is summed over, in the forward's order
// of use) grouped by equal key, groups in order of first appearance: a rank's gradient groups.
std::vector<std::vector<size_t>> group_in_order(const std::vector<std::vector<int64_t>>& keys);

// The buckets of one group's pieces (`numel` elements of `element_bytes` each, in the forward's
// order of use, the same on every member): filled from the last-used piece, at most
// `bucket_bytes` each (the first at most kFirstBucketBytes). With `zero1`, each bucket is split
// into equal segments over the `members` ranks of the group.
std::vector<BucketPlan> plan_buckets(const std::vector<int64_t>& numel, int64_t element_bytes,
                                     int64_t bucket_bytes, int64_t members, bool zero1);

}  // namespace loom::lower
