// A seeded random mutator for the fuzz tests of loom's readers (config, checkpoint, schedule
// CSV): byte flips, interesting values, insertions, deletions, duplications, truncation and
// splicing of numbers. Deterministic for a seed, so a failing input is reproduced from the
// seed and iteration printed with it.
#pragma once

#include <chrono>
#include <random>
#include <string>
#include <vector>

namespace loom::testing {

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  // One to four mutations of `input`.
  std::string mutate(std::string s) {
    const int n = 1 + pick(4);
    for (int i = 0; i < n; ++i) s = mutate_once(std::move(s));
    return s;
  }
  int pick(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }

 private:
  std::string mutate_once(std::string s) {
    static const std::vector<std::string> kTokens = {"-1",
                                                     "0",
                                                     "9223372036854775807",
                                                     "18446744073709551615",
                                                     "1e308",
                                                     "nan",
                                                     "\"",
                                                     "{",
                                                     "}",
                                                     "[",
                                                     "]",
                                                     ":",
                                                     ",",
                                                     "\n",
                                                     "  ",
                                                     "\0",
                                                     "\xff",
                                                     "null",
                                                     "true",
                                                     "[[0,1]]",
                                                     "- ",
                                                     "&a",
                                                     "*a",
                                                     "!!binary"};
    const size_t at = s.empty() ? 0 : static_cast<size_t>(rng_() % s.size());
    switch (pick(7)) {
      case 0:
        if (!s.empty()) s[at] = static_cast<char>(s[at] ^ (1 << pick(8)));
        break;
      case 1:
        if (!s.empty()) s[at] = static_cast<char>(rng_());
        break;
      case 2:
        s.insert(at, kTokens[static_cast<size_t>(pick(static_cast<int>(kTokens.size())))]);
        break;
      case 3:
        s.erase(at, static_cast<size_t>(pick(16)));
        break;
      case 4:
        s.insert(at, s.substr(static_cast<size_t>(rng_() % (s.size() + 1)),
                              static_cast<size_t>(pick(32))));
        break;
      case 5:
        s.resize(at);
        break;
      case 6: {  // replace a run of digits by another number
        size_t b = s.find_first_of("0123456789", at);
        if (b == std::string::npos) break;
        size_t e = s.find_first_not_of("0123456789", b);
        s.replace(b, e == std::string::npos ? std::string::npos : e - b,
                  kTokens[static_cast<size_t>(pick(4))]);
        break;
      }
    }
    return s;
  }
  std::mt19937_64 rng_;
};

// Runs `body(i)` for `max_iterations` iterations or until `max_seconds` have passed (a bound
// on the test's time, never an assertion); returns how many ran.
template <class F>
int run_bounded(int max_iterations, double max_seconds, F body) {
  const auto start = std::chrono::steady_clock::now();
  int i = 0;
  for (; i < max_iterations; ++i) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        max_seconds)
      break;
    body(i);
  }
  return i;
}

}  // namespace loom::testing
