// A reader of TensorBoard event files written for the tests from the format's definition (not
// from loom's writer): TFRecord framing with both CRC-32C checked, and Event protos decoded from
// the Protobuf wire format by TensorBoard's field numbers, so a wrong number or frame fails.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "observe/crc32c.h"

namespace loom::observe::event_reader {

inline uint64_t read_le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i)
    v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<size_t>(i)]);
  return v;
}

inline uint32_t mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// The records of a TFRecord file; each length and data CRC checked.
inline std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string file = ss.str();
  std::vector<std::string> records;
  size_t at = 0;
  while (at < file.size()) {
    if (file.size() - at < 12) {
      ADD_FAILURE() << "truncated header at byte " << at;
      break;
    }
    const uint64_t length = read_le(file, at, 8);
    EXPECT_EQ(read_le(file, at + 8, 4), mask(crc32c(file.substr(at, 8)))) << "length CRC at " << at;
    if (file.size() - at - 12 < length + 4) {
      ADD_FAILURE() << "truncated record at byte " << at;
      break;
    }
    std::string data = file.substr(at + 12, length);
    EXPECT_EQ(read_le(file, at + 12 + length, 4), mask(crc32c(data))) << "data CRC at " << at;
    records.push_back(std::move(data));
    at += 12 + length + 4;
  }
  return records;
}

// The Protobuf wire format, as much of it as Event uses.
struct Field {
  int number = 0;
  int wire = 0;  // 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32
  uint64_t value = 0;
  std::string bytes;
};

inline uint64_t varint(const std::string& s, size_t& at) {
  uint64_t v = 0;
  for (int shift = 0; at < s.size(); shift += 7) {
    const auto b = static_cast<unsigned char>(s[at++]);
    v |= uint64_t{b & 0x7Fu} << shift;
    if (!(b & 0x80)) return v;
  }
  ADD_FAILURE() << "truncated varint";
  return v;
}

inline std::vector<Field> fields(const std::string& s) {
  std::vector<Field> out;
  size_t at = 0;
  while (at < s.size()) {
    const uint64_t key = varint(s, at);
    Field f;
    f.number = static_cast<int>(key >> 3);
    f.wire = static_cast<int>(key & 7);
    if (f.wire == 0) {
      f.value = varint(s, at);
    } else if (f.wire == 1 || f.wire == 5) {
      const int n = f.wire == 1 ? 8 : 4;
      f.value = read_le(s, at, n);
      at += static_cast<size_t>(n);
    } else if (f.wire == 2) {
      const uint64_t n = varint(s, at);
      f.bytes = s.substr(at, n);
      at += n;
    } else {
      ADD_FAILURE() << "unexpected wire type " << f.wire;
      break;
    }
    out.push_back(std::move(f));
  }
  return out;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> scalars;
};

// TensorBoard's numbers: Event{wall_time=1 double, step=2 int64, file_version=3 string,
// summary=5}; Summary{repeated value=1}; Value{tag=1 string, simple_value=2 float}.
inline Event decode_event(const std::string& data) {
  Event e;
  for (const Field& f : fields(data)) {
    if (f.number == 1 && f.wire == 1) {
      std::memcpy(&e.wall_time, &f.value, 8);
    } else if (f.number == 2 && f.wire == 0) {
      e.step = static_cast<int64_t>(f.value);
    } else if (f.number == 3 && f.wire == 2) {
      e.file_version = f.bytes;
    } else if (f.number == 5 && f.wire == 2) {
      for (const Field& v : fields(f.bytes)) {
        EXPECT_EQ(v.number, 1);
        EXPECT_EQ(v.wire, 2);
        std::string tag;
        float value = NAN;
        for (const Field& x : fields(v.bytes)) {
          if (x.number == 1 && x.wire == 2) tag = x.bytes;
          if (x.number == 2 && x.wire == 5) {
            const auto bits = static_cast<uint32_t>(x.value);
            std::memcpy(&value, &bits, 4);
          }
        }
        e.scalars.emplace_back(tag, value);
      }
    } else {
      ADD_FAILURE() << "unexpected field " << f.number << " (wire type " << f.wire << ")";
    }
  }
  return e;
}

}  // namespace loom::observe::event_reader
