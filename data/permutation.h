// A seeded permutation of [0, n) computed element by element, in constant memory: a balanced
// Feistel network over the smallest even power of two covering n, walked until it lands inside
// [0, n). The same (n, seed) gives the same order on every machine and in every process.
#pragma once

#include <cstdint>

namespace loom::data {

class Permutation {
 public:
  Permutation() = default;
  Permutation(int64_t n, uint64_t seed);
  int64_t size() const { return n_; }
  // The element at position `i` (0 <= i < size()).
  int64_t operator()(int64_t i) const;

 private:
  uint64_t round(uint64_t half, int r) const;
  int64_t n_ = 0;
  int half_bits_ = 0;
  uint64_t keys_[4] = {0, 0, 0, 0};
};

// splitmix64: the mixing step seeds are derived with.
uint64_t mix64(uint64_t x);

}  // namespace loom::data
