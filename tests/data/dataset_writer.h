// A writer of Megatron-LM's indexed dataset written from the format's definition, independent of
// anything loom writes: header b"MMIDIDX\x00\x00", <Q version 1, <B dtype code, <Q sequence
// count, <Q document-index count, int32 lengths, int64 byte pointers, int64 document indices.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace loom::data::testing {

// Each document is a list of sequences, each sequence a list of ids.
using Documents = std::vector<std::vector<std::vector<int64_t>>>;

template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof v);
  out.append(b, sizeof b);
}

// Writes PREFIX.bin and PREFIX.idx; `code` is the dtype code, `width` its bytes per id.
inline void write_dataset(const std::string& prefix, const Documents& docs, uint8_t code = 8,
                          int width = 2) {
  std::string bin, lengths, pointers, doc_index;
  int64_t seqs = 0;
  put<int64_t>(doc_index, 0);
  for (const auto& doc : docs) {
    for (const auto& seq : doc) {
      put<int32_t>(lengths, static_cast<int32_t>(seq.size()));
      put<int64_t>(pointers, static_cast<int64_t>(bin.size()));
      for (int64_t id : seq) {
        if (width == 1) put<uint8_t>(bin, static_cast<uint8_t>(id));
        if (width == 2) put<uint16_t>(bin, static_cast<uint16_t>(id));
        if (width == 4) put<int32_t>(bin, static_cast<int32_t>(id));
        if (width == 8) put<int64_t>(bin, id);
      }
      ++seqs;
    }
    put<int64_t>(doc_index, seqs);
  }
  std::string idx("MMIDIDX\0\0", 9);
  put<uint64_t>(idx, 1);
  put<uint8_t>(idx, code);
  put<uint64_t>(idx, static_cast<uint64_t>(seqs));
  put<uint64_t>(idx, static_cast<uint64_t>(docs.size() + 1));
  idx += lengths + pointers + doc_index;
  std::ofstream(prefix + ".bin", std::ios::binary) << bin;
  std::ofstream(prefix + ".idx", std::ios::binary) << idx;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace loom::data::testing
