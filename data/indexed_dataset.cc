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

int64_t IndexedDataset::length(int64_t seq) const {
  return load<int32_t>(idx_->bytes() + lengths_at_ + 4 * seq);
}
int64_t IndexedDataset::pointer(int64_t seq) const {
  return load<int64_t>(idx_->bytes() + pointers_at_ + 8 * seq);
}
int64_t IndexedDataset::doc_entry(int64_t k) const {
  return load<int64_t>(idx_->bytes() + doc_index_at_ + 8 * k);
}

Result<std::shared_ptr<const IndexedDataset>> IndexedDataset::open(const std::string& prefix) {
  std::shared_ptr<IndexedDataset> d(new IndexedDataset());
  d->prefix_ = prefix;
  const std::string idx = d->idx_path(), bin = d->bin_path();
  auto bad = [&](const std::string& file, const std::string& what) {
    return Error::at(file, file + ": " + what);
  };
  LOOM_ASSIGN_OR_RETURN(d->idx_, MappedFile::open(idx));
  LOOM_ASSIGN_OR_RETURN(d->bin_, MappedFile::open(bin, /*map=*/false));
  const uint8_t* h = d->idx_->bytes();
  const int64_t idx_size = d->idx_->size();
  if (idx_size < kHeaderBytes)
    return bad(idx, "truncated: " + std::to_string(idx_size) + " bytes, shorter than the " +
                        std::to_string(kHeaderBytes) + "-byte header of an indexed dataset");
  if (std::memcmp(h, kMagic, sizeof kMagic) != 0)
    return bad(idx, "not a Megatron indexed dataset index (its first bytes are not MMIDIDX)");
  const uint64_t version = load<uint64_t>(h + 9);
  if (version != 1)
    return bad(idx, "index version " + std::to_string(version) + "; loom reads version 1");
  const uint8_t code = h[17];
  if (!known_dtype(code))
    return bad(idx, "unknown dtype code " + std::to_string(code) +
                        " (Megatron's codes are 1-8: uint8, int8, int16, int32, int64, float64, "
                        "float32, uint16)");
  d->dtype_ = static_cast<TokenDtype>(code);
  if (!integer_dtype(d->dtype_))
    return bad(idx, "dtype " + to_string(d->dtype_) + " cannot hold token ids");
  d->width_ = width_of(d->dtype_);
  const uint64_t seqs = load<uint64_t>(h + 18);
  const uint64_t doc_entries = load<uint64_t>(h + 26);
  // Both counts must fit the file before any size is computed from them.
  const uint64_t room = static_cast<uint64_t>(idx_size - kHeaderBytes);
  if (seqs > room / 12 || doc_entries > room / 8 || seqs * 12 + doc_entries * 8 > room)
    return bad(idx, "truncated: its header counts " + std::to_string(seqs) + " sequences and " +
                        std::to_string(doc_entries) + " document indices, which need " +
                        "more than its " + std::to_string(idx_size) + " bytes");
  d->sequences_ = static_cast<int64_t>(seqs);
  d->lengths_at_ = kHeaderBytes;
  d->pointers_at_ = d->lengths_at_ + 4 * d->sequences_;
  d->doc_index_at_ = d->pointers_at_ + 8 * d->sequences_;
  const int64_t expected = d->doc_index_at_ + 8 * static_cast<int64_t>(doc_entries);
  // Megatron's multimodal datasets append one mode byte per sequence.
  if (idx_size != expected && idx_size != expected + d->sequences_)
    return bad(idx, std::to_string(idx_size) + " bytes where its header's counts make " +
                        std::to_string(expected) + " (a truncated or padded index)");
  if (doc_entries < 2 || d->sequences_ == 0) return bad(idx, "an empty dataset: no documents");
  d->documents_ = static_cast<int64_t>(doc_entries) - 1;

  const int64_t bin_size = d->bin_->size();
  if (bin_size % d->width_ != 0)
    return bad(bin, std::to_string(bin_size) + " bytes, not a whole number of " +
                        to_string(d->dtype_) + " ids (truncated?)");
  for (int64_t s = 0; s < d->sequences_; ++s) {
    const int64_t n = d->length(s);
    const int64_t p = d->pointer(s);
    if (n < 0)
      return bad(idx,
                 "sequence " + std::to_string(s) + " has a negative length " + std::to_string(n));
    if (p < 0 || p % d->width_ != 0 || p > bin_size || n > (bin_size - p) / d->width_)
      return bad(bin, std::to_string(bin_size) + " bytes, but " + idx + " places sequence " +
                          std::to_string(s) + " (" + std::to_string(n) + " tokens at byte " +
                          std::to_string(p) +
                          ") outside them (a truncated data file, or the index of another)");
    d->tokens_ += n;
  }
  bool one_each = true;
  for (int64_t k = 0; k <= d->documents_; ++k) {
    const int64_t v = d->doc_entry(k);
    const int64_t before = k == 0 ? 0 : d->doc_entry(k - 1);
    if ((k == 0 && v != 0) || v < before || v > d->sequences_ ||
        (k == d->documents_ && v != d->sequences_))
      return bad(idx, "document index " + std::to_string(k) + " is " + std::to_string(v) +
                          "; document indices rise from 0 to the sequence count (" +
                          std::to_string(d->sequences_) + ")");
    one_each &= v == k;
  }
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
