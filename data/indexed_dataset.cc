#include "data/indexed_dataset.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

namespace loom::data {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr int64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

bool known_dtype(uint8_t code) { return code >= 1 && code <= 8; }

bool integer_dtype(TokenDtype d) { return d != TokenDtype::kFloat32 && d != TokenDtype::kFloat64; }

// The smallest and largest id of `count` ids, and the index of the first outside [0, vocab)
// (-1 when none).
template <class T>
int64_t first_outside(const uint8_t* src, int64_t count, int64_t vocab) {
  const T* ids = reinterpret_cast<const T*>(src);  // the buffer is aligned (read_chunk)
  // The bound test vectorises; the position is searched only in a chunk that has one.
  bool any = false;
  for (int64_t i = 0; i < count; ++i)
    any |= static_cast<int64_t>(ids[i]) < 0 || static_cast<int64_t>(ids[i]) >= vocab;
  if (!any) return -1;
  for (int64_t i = 0; i < count; ++i)
    if (static_cast<int64_t>(ids[i]) < 0 || static_cast<int64_t>(ids[i]) >= vocab) return i;
  return -1;
}

int64_t first_outside(TokenDtype dtype, const uint8_t* src, int64_t count, int64_t vocab) {
  switch (dtype) {
    case TokenDtype::kUint8:
      return first_outside<uint8_t>(src, count, vocab);
    case TokenDtype::kInt8:
      return first_outside<int8_t>(src, count, vocab);
    case TokenDtype::kInt16:
      return first_outside<int16_t>(src, count, vocab);
    case TokenDtype::kInt32:
      return first_outside<int32_t>(src, count, vocab);
    case TokenDtype::kInt64:
      return first_outside<int64_t>(src, count, vocab);
    case TokenDtype::kUint16:
      return first_outside<uint16_t>(src, count, vocab);
    case TokenDtype::kFloat32:
    case TokenDtype::kFloat64:
      break;
  }
  return 0;
}

}  // namespace

void widen(TokenDtype dtype, const uint8_t* src, int64_t count, int64_t* out) {
  switch (dtype) {
#define LOOM_WIDEN(kind, type)                                                       \
  case TokenDtype::kind:                                                             \
    for (int64_t i = 0; i < count; ++i) out[i] = load<type>(src + i * sizeof(type)); \
    return;
    LOOM_WIDEN(kUint8, uint8_t)
    LOOM_WIDEN(kInt8, int8_t)
    LOOM_WIDEN(kInt16, int16_t)
    LOOM_WIDEN(kInt32, int32_t)
    LOOM_WIDEN(kInt64, int64_t)
    LOOM_WIDEN(kUint16, uint16_t)
#undef LOOM_WIDEN
    case TokenDtype::kFloat32:
    case TokenDtype::kFloat64:
      break;
  }
  LOOM_CHECK(false) << "token ids of dtype " << to_string(dtype);
}

std::string to_string(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::kUint8:
      return "uint8";
    case TokenDtype::kInt8:
      return "int8";
    case TokenDtype::kInt16:
      return "int16";
    case TokenDtype::kInt32:
      return "int32";
    case TokenDtype::kInt64:
      return "int64";
    case TokenDtype::kFloat64:
      return "float64";
    case TokenDtype::kFloat32:
      return "float32";
    case TokenDtype::kUint16:
      return "uint16";
  }
  return "unknown";
}

int64_t width_of(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::kUint8:
    case TokenDtype::kInt8:
      return 1;
    case TokenDtype::kInt16:
    case TokenDtype::kUint16:
      return 2;
    case TokenDtype::kInt32:
    case TokenDtype::kFloat32:
      return 4;
    case TokenDtype::kInt64:
    case TokenDtype::kFloat64:
      return 8;
  }
  return 1;
}

namespace {

Error bad(const std::string& file, const std::string& what) {
  return Error::at(file, file + ": " + what);
}

// The index's arrays, read element by element from its bytes: they start at byte 34, unaligned.
struct IndexArrays {
  const uint8_t* bytes = nullptr;
  int64_t lengths_at = 0, pointers_at = 0, doc_index_at = 0;  // byte offsets

  int64_t length(int64_t seq) const { return load<int32_t>(bytes + lengths_at + 4 * seq); }
  int64_t pointer(int64_t seq) const { return load<int64_t>(bytes + pointers_at + 8 * seq); }
  int64_t doc_entry(int64_t k) const { return load<int64_t>(bytes + doc_index_at + 8 * k); }
};

// What the index's header says, checked against the index's size.
struct IndexHeader {
  TokenDtype dtype = TokenDtype::kUint16;
  int64_t sequences = 0, documents = 0;
  IndexArrays arrays;
};

// The header of `idx` (at `path`): magic, version, an integer dtype, and counts whose arrays
// make the file's size.
Result<IndexHeader> read_header(const MappedFile& idx, const std::string& path) {
  const uint8_t* h = idx.bytes();
  const int64_t idx_size = idx.size();
  if (idx_size < kHeaderBytes)
    return bad(path, "truncated: " + std::to_string(idx_size) + " bytes, shorter than the " +
                         std::to_string(kHeaderBytes) + "-byte header of an indexed dataset");
  if (std::memcmp(h, kMagic, sizeof kMagic) != 0)
    return bad(path, "not a Megatron indexed dataset index (its first bytes are not MMIDIDX)");
  const uint64_t version = load<uint64_t>(h + 9);
  if (version != 1)
    return bad(path, "index version " + std::to_string(version) + "; loom reads version 1");
  const uint8_t code = h[17];
  if (!known_dtype(code))
    return bad(path, "unknown dtype code " + std::to_string(code) +
                         " (Megatron's codes are 1-8: uint8, int8, int16, int32, int64, float64, "
                         "float32, uint16)");
  IndexHeader out;
  out.dtype = static_cast<TokenDtype>(code);
  if (!integer_dtype(out.dtype))
    return bad(path, "dtype " + to_string(out.dtype) + " cannot hold token ids");
  const uint64_t seqs = load<uint64_t>(h + 18);
  const uint64_t doc_entries = load<uint64_t>(h + 26);
  // Both counts must fit the file before any size is computed from them.
  const uint64_t room = static_cast<uint64_t>(idx_size - kHeaderBytes);
  if (seqs > room / 12 || doc_entries > room / 8 || seqs * 12 + doc_entries * 8 > room)
    return bad(path, "truncated: its header counts " + std::to_string(seqs) + " sequences and " +
                         std::to_string(doc_entries) + " document indices, which need " +
                         "more than its " + std::to_string(idx_size) + " bytes");
  out.sequences = static_cast<int64_t>(seqs);
  out.arrays.bytes = h;
  out.arrays.lengths_at = kHeaderBytes;
  out.arrays.pointers_at = out.arrays.lengths_at + 4 * out.sequences;
  out.arrays.doc_index_at = out.arrays.pointers_at + 8 * out.sequences;
  const int64_t expected = out.arrays.doc_index_at + 8 * static_cast<int64_t>(doc_entries);
  // Megatron's multimodal datasets append one mode byte per sequence.
  if (idx_size != expected && idx_size != expected + out.sequences)
    return bad(path, std::to_string(idx_size) + " bytes where its header's counts make " +
                         std::to_string(expected) + " (a truncated or padded index)");
  if (doc_entries < 2 || out.sequences == 0) return bad(path, "an empty dataset: no documents");
  out.documents = static_cast<int64_t>(doc_entries) - 1;
  return out;
}

// The tokens of all sequences, each of which must lie inside the data file `bin` (at
// `bin_path`, of `width`-byte ids).
Result<int64_t> count_tokens(const IndexHeader& header, int64_t width, const MappedFile& bin,
                             const std::string& idx_path, const std::string& bin_path) {
  const int64_t bin_size = bin.size();
  if (bin_size % width != 0)
    return bad(bin_path, std::to_string(bin_size) + " bytes, not a whole number of " +
                             to_string(header.dtype) + " ids (truncated?)");
  int64_t tokens = 0;
  for (int64_t s = 0; s < header.sequences; ++s) {
    const int64_t n = header.arrays.length(s);
    const int64_t p = header.arrays.pointer(s);
    if (n < 0)
      return bad(idx_path,
                 "sequence " + std::to_string(s) + " has a negative length " + std::to_string(n));
    if (p < 0 || p % width != 0 || p > bin_size || n > (bin_size - p) / width)
      return bad(bin_path, std::to_string(bin_size) + " bytes, but " + idx_path +
                               " places sequence " + std::to_string(s) + " (" + std::to_string(n) +
                               " tokens at byte " + std::to_string(p) +
                               ") outside them (a truncated data file, or the index of another)");
    tokens += n;
  }
  return tokens;
}

// Checks that the document index rises from 0 to the sequence count; true when every document
// is one sequence.
Result<bool> check_document_index(const IndexHeader& header, const std::string& idx_path) {
  bool one_each = true;
  for (int64_t k = 0; k <= header.documents; ++k) {
    const int64_t v = header.arrays.doc_entry(k);
    const int64_t before = k == 0 ? 0 : header.arrays.doc_entry(k - 1);
    if ((k == 0 && v != 0) || v < before || v > header.sequences ||
        (k == header.documents && v != header.sequences))
      return bad(idx_path, "document index " + std::to_string(k) + " is " + std::to_string(v) +
                               "; document indices rise from 0 to the sequence count (" +
                               std::to_string(header.sequences) + ")");
    one_each &= v == k;
  }
  return one_each;
}

IndexArrays arrays_of(const MappedFile& idx, int64_t lengths_at, int64_t pointers_at,
                      int64_t doc_index_at) {
  return {idx.bytes(), lengths_at, pointers_at, doc_index_at};
}

}  // namespace

int64_t IndexedDataset::length(int64_t seq) const {
  return arrays_of(*idx_, lengths_at_, pointers_at_, doc_index_at_).length(seq);
}
int64_t IndexedDataset::pointer(int64_t seq) const {
  return arrays_of(*idx_, lengths_at_, pointers_at_, doc_index_at_).pointer(seq);
}
int64_t IndexedDataset::doc_entry(int64_t k) const {
  return arrays_of(*idx_, lengths_at_, pointers_at_, doc_index_at_).doc_entry(k);
}

Result<std::shared_ptr<const IndexedDataset>> IndexedDataset::open(const std::string& prefix) {
  std::shared_ptr<IndexedDataset> d(new IndexedDataset());
  d->prefix_ = prefix;
  const std::string idx = d->idx_path(), bin = d->bin_path();
  LOOM_ASSIGN_OR_RETURN(d->idx_, MappedFile::open(idx));
  LOOM_ASSIGN_OR_RETURN(d->bin_, MappedFile::open(bin, /*map=*/false));
  LOOM_ASSIGN_OR_RETURN(const IndexHeader header, read_header(*d->idx_, idx));
  d->dtype_ = header.dtype;
  d->width_ = width_of(d->dtype_);
  d->sequences_ = header.sequences;
  d->documents_ = header.documents;
  d->lengths_at_ = header.arrays.lengths_at;
  d->pointers_at_ = header.arrays.pointers_at;
  d->doc_index_at_ = header.arrays.doc_index_at;
  LOOM_ASSIGN_OR_RETURN(d->tokens_, count_tokens(header, d->width_, *d->bin_, idx, bin));
  LOOM_ASSIGN_OR_RETURN(const bool one_each, check_document_index(header, idx));
  if (d->tokens_ == 0) return bad(idx, "an empty dataset: its documents hold no tokens");
  if (!one_each) {
    d->doc_lengths_.resize(static_cast<size_t>(d->documents_));
    for (int64_t k = 0; k < d->documents_; ++k)
      for (int64_t s = d->doc_entry(k); s < d->doc_entry(k + 1); ++s)
        d->doc_lengths_[static_cast<size_t>(k)] += d->length(s);
  }
  return std::shared_ptr<const IndexedDataset>(std::move(d));
}

int64_t IndexedDataset::document_length(int64_t doc) const {
  if (!doc_lengths_.empty()) return doc_lengths_[static_cast<size_t>(doc)];
  return length(doc);
}

void IndexedDataset::read_sequence(int64_t seq, int64_t offset, int64_t count, int64_t* out) const {
  thread_local std::vector<uint8_t> bytes;
  bytes.resize(static_cast<size_t>(count * width_));
  // Every pointer and length was checked against the file's size when it was opened.
  LOOM_CHECK(bin_->read(pointer(seq) + offset * width_, count * width_, bytes.data()))
      << bin_path() << ": shorter than when it was opened";
  widen(dtype_, bytes.data(), count, out);
}

void IndexedDataset::read_document(int64_t doc, int64_t offset, int64_t count, int64_t* out) const {
  LOOM_CHECK(offset >= 0 && count >= 0 && offset + count <= document_length(doc))
      << prefix_ << ": document " << doc << " read [" << offset << ", " << offset + count << ")";
  if (doc_lengths_.empty()) {
    read_sequence(doc, offset, count, out);
    return;
  }
  for (int64_t s = doc_entry(doc); s < doc_entry(doc + 1) && count > 0; ++s) {
    const int64_t n = length(s);
    if (offset >= n) {
      offset -= n;
      continue;
    }
    const int64_t take = std::min(count, n - offset);
    read_sequence(s, offset, take, out);
    out += take;
    count -= take;
    offset = 0;
  }
}

Result<int64_t> first_id_outside(const MappedFile& file, TokenDtype dtype, int64_t vocab,
                                 int64_t* id) {
  constexpr int64_t kChunk = int64_t{4} << 20;
  std::vector<int64_t> storage(static_cast<size_t>(kChunk / 8));  // 8-byte aligned
  uint8_t* buf = reinterpret_cast<uint8_t*>(storage.data());
  const int64_t width = width_of(dtype);
  const int64_t total = file.size() / width * width;
  for (int64_t at = 0; at < total;) {
    const ssize_t got =
        ::pread(file.fd(), buf, static_cast<size_t>(std::min(kChunk, total - at)), at);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      return Error::at(file.path(), file.path() + ": read failed at byte " + std::to_string(at) +
                                        (got < 0 ? ": " + std::string(std::strerror(errno)) : ""));
    const int64_t ids = got / width;
    const int64_t bad = first_outside(dtype, buf, ids, vocab);
    if (bad >= 0) {
      widen(dtype, buf + bad * width, 1, id);
      return at + bad * width;
    }
    at += ids * width;
  }
  return int64_t{-1};
}

Status IndexedDataset::check_ids(int64_t vocab) const {
  int64_t id = 0;
  LOOM_ASSIGN_OR_RETURN(const int64_t byte, first_id_outside(*bin_, dtype_, vocab, &id));
  if (byte < 0) return Status::success();
  // The sequence holding it, for a message a user can find it by.
  int64_t seq = -1;
  for (int64_t s = 0; s < sequences_ && seq < 0; ++s)
    if (byte >= pointer(s) && byte < pointer(s) + length(s) * width_) seq = s;
  std::string where = "at byte " + std::to_string(byte) + " (in no sequence)";
  if (seq >= 0) {
    int64_t k = 0;
    while (k + 1 < documents_ && doc_entry(k + 1) <= seq) ++k;
    where = "in document " + std::to_string(k) + " (sequence " + std::to_string(seq) +
            ", position " + std::to_string((byte - pointer(seq)) / width_) + ")";
  }
  return Error::at(bin_path(), bin_path() + ": token id " + std::to_string(id) + " " + where +
                                   " is outside the model's vocabulary [0, " +
                                   std::to_string(vocab) + ")");
}

}  // namespace loom::data
