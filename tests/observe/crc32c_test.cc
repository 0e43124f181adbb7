#include "observe/crc32c.h"

#include <gtest/gtest.h>

#include <string>

namespace loom::observe {
namespace {

// The check value of CRC-32C and the vectors of RFC 3720 (iSCSI), appendix B.4.
TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending), 0x113FDB5Cu);
}

TEST(Crc32c, ContinuesOverPieces) {
  EXPECT_EQ(crc32c("6789", crc32c("12345")), crc32c("123456789"));
}

// TFRecord's mask: rotate right by 15, add a constant (computed here from its definition).
TEST(Crc32c, Masked) {
  const uint32_t crc = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789"), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  EXPECT_NE(masked_crc32c("123456789"), crc);
}

}  // namespace
}  // namespace loom::observe
