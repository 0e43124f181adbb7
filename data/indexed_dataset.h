// Megatron-LM's indexed token dataset, read as it is: PREFIX.bin holds the token ids of every
// sequence back to back; PREFIX.idx holds the header (`MMIDIDX\x00\x00`, version 1 as uint64, a
// dtype code as uint8, the sequence count and the document-index count as uint64), then the
// sequence lengths (int32, in tokens), the sequences' byte offsets into PREFIX.bin (int64) and
// the document indices (int64: document k is sequences [doc[k], doc[k+1])). Both files are
// memory-mapped; every length, offset and index is checked against the files when opened.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"
#include "data/mapped_file.h"

namespace loom::data {

// Megatron's DType codes.
enum class TokenDtype : uint8_t {
  kUint8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUint16 = 8,
};
// "uint16", "int32", ...
std::string to_string(TokenDtype dtype);
// Bytes per id.
int64_t width_of(TokenDtype dtype);

// The byte offset in `file` (ids of `dtype` back to back) of the first id outside [0, vocab),
// that id in `id`; -1 when every id is inside. Reads through read(2), not the mapping.
Result<int64_t> first_id_outside(const MappedFile& file, TokenDtype dtype, int64_t vocab,
                                 int64_t* id);
// Converts `count` ids of `dtype` at `src` to int64.
void widen(TokenDtype dtype, const uint8_t* src, int64_t count, int64_t* out);

class IndexedDataset {
 public:
  // Opens PREFIX.idx and PREFIX.bin. Fails naming the file and what is wrong: a missing or
  // truncated file, a bad header, an unknown or non-integer dtype, a length, offset or document
  // index outside its file, no documents.
  static Result<std::shared_ptr<const IndexedDataset>> open(const std::string& prefix);

  const std::string& prefix() const { return prefix_; }
  std::string idx_path() const { return prefix_ + ".idx"; }
  std::string bin_path() const { return prefix_ + ".bin"; }
  TokenDtype dtype() const { return dtype_; }
  int64_t sequences() const { return sequences_; }
  int64_t documents() const { return documents_; }
  int64_t tokens() const { return tokens_; }
  // Tokens of document `doc` (all its sequences).
  int64_t document_length(int64_t doc) const;
  // Writes `count` ids of document `doc`, from its token `offset` on, to `out`.
  void read_document(int64_t doc, int64_t offset, int64_t count, int64_t* out) const;

  // Reads every id (through read(2), not the mapping, so the scan leaves nothing resident) and
  // fails naming the file, the document and the position of the first id outside [0, vocab).
  Status check_ids(int64_t vocab) const;

 private:
  IndexedDataset() = default;
  // The index's arrays, element by element: they start at byte 34 of the file, unaligned.
  int64_t length(int64_t seq) const;
  int64_t pointer(int64_t seq) const;
  int64_t doc_entry(int64_t k) const;
  void read_sequence(int64_t seq, int64_t offset, int64_t count, int64_t* out) const;

  std::string prefix_;
  std::unique_ptr<MappedFile> idx_, bin_;
  TokenDtype dtype_ = TokenDtype::kUint16;
  int64_t width_ = 2;
  int64_t sequences_ = 0, documents_ = 0, tokens_ = 0;
  int64_t lengths_at_ = 0, pointers_at_ = 0, doc_index_at_ = 0;  // byte offsets into .idx
  // Documents of several sequences: each document's length (empty when every document is one
  // sequence, the layout loom's and Megatron's GPT tools write).
  std::vector<int64_t> doc_lengths_;
};

}  // namespace loom::data
