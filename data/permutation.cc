#include "data/permutation.h"

#include "core/check.h"

namespace loom::data {

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

Permutation::Permutation(int64_t n, uint64_t seed) : n_(n) {
  LOOM_CHECK(n >= 0) << "permutation of " << n << " elements";
  int bits = 0;
  while ((int64_t{1} << bits) < n) ++bits;
  half_bits_ = (bits + 1) / 2;
  if (half_bits_ == 0) half_bits_ = 1;
  uint64_t k = seed;
  for (uint64_t& key : keys_) key = k = mix64(k);
}

uint64_t Permutation::round(uint64_t half, int r) const {
  return mix64(half ^ keys_[r]) & ((uint64_t{1} << half_bits_) - 1);
}

int64_t Permutation::operator()(int64_t i) const {
  LOOM_CHECK(i >= 0 && i < n_) << "position " << i << " of a permutation of " << n_;
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t x = static_cast<uint64_t>(i);
  // Cycle walking: the network permutes [0, 4^half_bits), less than 4n (or 4), so a walk takes
  // fewer than four rounds on average and ends inside [0, n).
  do {
    uint64_t left = x >> half_bits_, right = x & mask;
    for (int r = 0; r < 4; ++r) {
      const uint64_t next = left ^ round(right, r);
      left = right;
      right = next;
    }
    x = (left << half_bits_) | right;
  } while (x >= static_cast<uint64_t>(n_));
  return static_cast<int64_t>(x);
}

}  // namespace loom::data
