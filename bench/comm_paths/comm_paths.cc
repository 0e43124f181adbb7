// bench/comm_paths: path search time between RVD layouts of a 4-D tensor [16, 64, 64, 128]
// over 8 devices (all layout pairs) and 64 devices (a seeded sample of pairs), cold (empty
// cache) and cached (the same queries again). The cached/cold ratio is the cache's worth.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "lower/path.h"

namespace {

using loom::DeviceId;
using loom::lower::Layout;

// Every way to spread `n` devices (a power of two) over R, V and the 4 dimensions.
void layouts(int64_t n, size_t factor, std::vector<int64_t>& f, std::vector<Layout>& out,
             const std::vector<DeviceId>& devices) {
  if (factor == f.size() - 1) {
    f[factor] = n;
    Layout l;
    l.r = f[0];
    l.v = f[1];
    l.d.assign(f.begin() + 2, f.end());
    l.devices = devices;
    out.push_back(l);
    return;
  }
  for (int64_t k = 1; k <= n; k *= 2) {
    f[factor] = k;
    layouts(n / k, factor + 1, f, out, devices);
  }
}

void run(int64_t n, size_t max_pairs) {
  std::vector<DeviceId> devices;
  for (int64_t i = 0; i < n; ++i) devices.push_back(DeviceId(i));
  std::vector<int64_t> f(6, 1);
  std::vector<Layout> candidates, all;
  layouts(n, 0, f, candidates, devices);
  const loom::Shape shape{16, 64, 64, 128};
  for (const Layout& l : candidates)
    if (l.validate(&shape).ok()) all.push_back(l);
  std::vector<std::pair<size_t, size_t>> pairs;
  for (size_t a = 0; a < all.size(); ++a)
    for (size_t b = 0; b < all.size(); ++b) pairs.push_back({a, b});
  if (pairs.size() > max_pairs) {
    std::mt19937 rng(1);
    std::shuffle(pairs.begin(), pairs.end(), rng);
    pairs.resize(max_pairs);
  }
  loom::lower::PathFinder finder;
  auto time = [&] {
    auto t0 = std::chrono::steady_clock::now();
    for (auto [a, b] : pairs)
      if (auto p = finder.find(shape, 4, all[a], all[b]); !p.ok()) {
        std::fprintf(stderr, "%s\n", p.error().message.c_str());
        std::exit(1);
      }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double cold = time();
  double cached = time();
  std::printf(
      "%3lld devices  %4zu layouts  %6zu pairs  cold %8.3f s (%7.1f us/pair)  cached %7.4f s "
      "(%5.2f us/pair)  cached/cold %.4f\n",
      static_cast<long long>(n), all.size(), pairs.size(), cold, cold / pairs.size() * 1e6, cached,
      cached / pairs.size() * 1e6, cached / cold);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::err);  // fallbacks through replication are expected here
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  std::printf("bench/comm_paths: RVD path search for a 4-D tensor\n");
  run(8, quick ? 200 : 1000000);
  if (!quick) run(64, 2000);
  return 0;
}
