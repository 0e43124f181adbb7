// Random RVD layouts for property tests: each prime factor of the device count goes to R, V or
// a dimension it divides, and the devices are shuffled.
#pragma once

#include <algorithm>
#include <random>

#include "lower/layout.h"

namespace loom::lower {

inline Layout random_layout(std::mt19937& rng, const Shape& shape, std::vector<DeviceId> devices) {
  int64_t n = static_cast<int64_t>(devices.size());
  Layout l;
  l.d.assign(shape.size(), 1);
  // Assign each prime factor of n to R, V or a dimension it divides.
  for (int64_t p = 2; n > 1;) {
    if (n % p) {
      ++p;
      continue;
    }
    n /= p;
    std::vector<int> options{0, 1};
    for (size_t k = 0; k < shape.size(); ++k)
      if (shape[k] % (l.d[k] * p) == 0) options.push_back(static_cast<int>(k) + 2);
    int pick = options[rng() % options.size()];
    if (pick == 0)
      l.r *= p;
    else if (pick == 1)
      l.v *= p;
    else
      l.d[pick - 2] *= p;
  }
  std::shuffle(devices.begin(), devices.end(), rng);
  l.devices = std::move(devices);
  return l;
}

}  // namespace loom::lower
