// CRC-32 (IEEE 802.3, the polynomial of zlib and PNG): the checksum of checkpoint files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace loom {

// Continues `crc` (0 to start) over `size` bytes at `data`.
uint32_t crc32(const void* data, size_t size, uint32_t crc = 0);
inline uint32_t crc32(std::string_view bytes, uint32_t crc = 0) {
  return crc32(bytes.data(), bytes.size(), crc);
}

}  // namespace loom
