// A job's rendezvous secret: random bytes from the kernel as hex. loomrun makes one per job and
// hands it to its workers (LOOM_RDZV_TOKEN); the store hosted by rank 0 admits only connections
// that present it. Header-only so that loomrun, which links nothing of loom, shares it.
#pragma once

#include <sys/random.h>

#include <cerrno>
#include <cstddef>
#include <string>

namespace loom {

// The environment variable that carries the secret to every rank of a job.
constexpr const char* kRdzvTokenEnv = "LOOM_RDZV_TOKEN";

// 32 hex digits (128 bits) from getrandom(2); "" when the kernel gives none.
inline std::string random_secret() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return "";
    got += static_cast<size_t>(n);
  }
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

}  // namespace loom
