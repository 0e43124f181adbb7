// Where a language model's samples come from. Sample `index` is a pure function of the index
// (and the data and seed), so every plan (micro-batching, data parallelism, pipelining) sees the
// same samples as one device, and a resumed run continues the exact order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"
#include "data/indexed_dataset.h"
#include "data/permutation.h"

namespace loom::data {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Writes the seq + 1 token ids of sample `index` (>= 0; past the end, epochs repeat) to
  // `out`: the inputs are the first seq, the targets the last seq.
  virtual Status sample(int64_t index, int64_t* out) = 0;
  // Distinct samples before the order repeats (or reshuffles).
  virtual int64_t samples_per_epoch() const = 0;
};

// Which documents of a dataset a sampler reads: all of them in file order, or one side of a
// seeded split (the held-out documents, or the rest).
struct DocumentSet {
  static DocumentSet all(int64_t documents);
  // round(fraction * documents) documents, at least one, chosen by `seed`; `held_out` picks
  // them, else the rest. Fails when no document would be left on a side.
  static Result<DocumentSet> split(int64_t documents, double fraction, uint64_t seed,
                                   bool held_out);
  int64_t size() const { return count; }
  int64_t operator()(int64_t j) const { return shuffled ? order(begin + j) : begin + j; }

  bool shuffled = false;
  Permutation order;
  int64_t begin = 0, count = 0;
};

// Samples of seq + 1 tokens cut from the documents of `docs` laid end to end (each ends with the
// eos its tokenizer appended), the next starting where the last one's inputs end (the shared
// token is one sample's last target and the next one's first input). With `shuffle`, each epoch
// lays the documents in a new seeded order and visits its samples in a seeded order.
class DocumentSamples : public TokenSource {
 public:
  // Fails naming the dataset when its documents hold fewer than seq + 1 tokens.
  static Result<std::unique_ptr<DocumentSamples>> make(std::shared_ptr<const IndexedDataset> data,
                                                       DocumentSet docs, int64_t seq, uint64_t seed,
                                                       bool shuffle);
  Status sample(int64_t index, int64_t* out) override;
  int64_t samples_per_epoch() const override { return per_epoch_; }
  int64_t tokens() const { return tokens_; }

 private:
  DocumentSamples() = default;
  // Where each document of `epoch`'s order starts in that epoch's token stream (one entry per
  // document, then the total); the last two epochs are kept.
  const std::vector<int64_t>& starts(int64_t epoch);
  int64_t document_at(int64_t epoch, int64_t k) const;

  std::shared_ptr<const IndexedDataset> data_;
  DocumentSet docs_;
  int64_t seq_ = 0, tokens_ = 0, per_epoch_ = 0;
  uint64_t seed_ = 0;
  bool shuffle_ = true;
  struct Epoch {
    int64_t index = -1;
    Permutation documents;
    std::vector<int64_t> starts;
  };
  Epoch epochs_[2];
  int64_t next_slot_ = 0;
};

// Datasets mixed by weight: sample i comes from the dataset whose share so far lags its weight
// most (Megatron's blending rule), as that dataset's next sample. Exact proportions at every
// prefix, deterministic, and O(datasets) memory: the counts are walked forward from the last
// index asked (from 0 when an earlier one is asked).
class BlendedSource : public TokenSource {
 public:
  BlendedSource(std::vector<double> weights, std::vector<std::unique_ptr<TokenSource>> sources);
  Status sample(int64_t index, int64_t* out) override;
  int64_t samples_per_epoch() const override;
  // The dataset sample `index` comes from, and its index there.
  std::pair<size_t, int64_t> locate(int64_t index);

 private:
  std::vector<double> weights_;  // summing to 1
  std::vector<std::unique_ptr<TokenSource>> sources_;
  int64_t next_ = 0;             // the index the counts stand before
  std::vector<int64_t> counts_;  // samples taken from each dataset before next_
};

// Windows of a flat file of little-endian token ids (nanoGPT's format), in file order.
class TokenFileSource : public TokenSource {
 public:
  // Fails naming the file when it cannot be read, is not a whole number of ids, holds fewer
  // than seq + 1 of them, or holds an id outside [0, vocab).
  static Result<std::unique_ptr<TokenFileSource>> open(const std::string& path, int64_t token_bytes,
                                                       int64_t vocab, int64_t seq);
  Status sample(int64_t index, int64_t* out) override;
  int64_t samples_per_epoch() const override { return windows_; }

 private:
  TokenFileSource() = default;
  std::unique_ptr<MappedFile> file_;
  TokenDtype dtype_ = TokenDtype::kUint16;
  int64_t seq_ = 0, windows_ = 0;
  std::vector<uint8_t> bytes_;  // one sample's ids as read, reused
};

// Seeded arithmetic sequences (start + stride * t mod vocab): learnable, so the loss falls.
class SyntheticSource : public TokenSource {
 public:
  SyntheticSource(uint64_t seed, int64_t vocab, int64_t seq)
      : seed_(seed), vocab_(vocab), seq_(seq) {}
  Status sample(int64_t index, int64_t* out) override;
  int64_t samples_per_epoch() const override { return int64_t{1} << 62; }

 private:
  uint64_t seed_;
  int64_t vocab_, seq_;
};

}  // namespace loom::data
