#include "observe/crc32c.h"

#include <array>

namespace loom::observe {
namespace {

// The reflected Castagnoli polynomial, one byte per step: event records are a few hundred bytes
// once per training step, so a table of 256 entries is plenty.
std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82F63B78u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}

}  // namespace

uint32_t crc32c(std::string_view bytes, uint32_t crc) {
  static const std::array<uint32_t, 256> kTable = make_table();
  crc = ~crc;
  for (const char c : bytes)
    crc = kTable[(crc ^ static_cast<unsigned char>(c)) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

}  // namespace loom::observe
