// CRC-32C (Castagnoli, the polynomial of iSCSI and ext4): the checksum that frames TensorBoard's
// event-file records.
#pragma once

#include <cstdint>
#include <string_view>

namespace loom::observe {

// Continues `crc` (0 to start) over `bytes`.
uint32_t crc32c(std::string_view bytes, uint32_t crc = 0);

// The masked form stored in TFRecord files: a CRC of data that holds CRCs is itself no weaker.
inline uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace loom::observe
