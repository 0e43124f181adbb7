#include "data/token_source.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

namespace loom::data {

DocumentSet DocumentSet::all(int64_t documents) {
  DocumentSet s;
  s.count = documents;
  return s;
}

Result<DocumentSet> DocumentSet::split(int64_t documents, double fraction, uint64_t seed,
                                       bool held_out) {
  const int64_t held =
      std::max<int64_t>(1, std::llround(fraction * static_cast<double>(documents)));
  if (held >= documents)
    return Error::at("eval.split", "eval.split " + std::to_string(fraction) + " of " +
                                       std::to_string(documents) +
                                       " documents leaves none to train on");
  DocumentSet s;
  s.shuffled = true;
  s.order = Permutation(documents, mix64(seed ^ 0x5EED5711ull));
  s.begin = held_out ? 0 : held;
  s.count = held_out ? held : documents - held;
  return s;
}

Result<std::unique_ptr<DocumentSamples>> DocumentSamples::make(
    std::shared_ptr<const IndexedDataset> data, DocumentSet docs, int64_t seq, uint64_t seed,
    bool shuffle) {
  std::unique_ptr<DocumentSamples> s(new DocumentSamples());
  for (int64_t j = 0; j < docs.size(); ++j) s->tokens_ += data->document_length(docs(j));
  if (s->tokens_ < seq + 1)
    return Error::at(data->prefix(),
                     data->prefix() + ": " + std::to_string(docs.size()) + " documents of " +
                         std::to_string(s->tokens_) +
                         " tokens in all; one sample needs seq + 1 = " + std::to_string(seq + 1));
  s->data_ = std::move(data);
  s->docs_ = std::move(docs);
  s->seq_ = seq;
  s->per_epoch_ = (s->tokens_ - 1) / seq;
  s->seed_ = seed;
  s->shuffle_ = shuffle;
  return s;
}

const std::vector<int64_t>& DocumentSamples::starts(int64_t epoch) {
  for (Epoch& e : epochs_)
    if (e.index == epoch) return e.starts;
  Epoch& e = epochs_[next_slot_];
  next_slot_ = 1 - next_slot_;
  e.index = epoch;
  if (shuffle_)
    e.documents = Permutation(docs_.size(), mix64(seed_ ^ mix64(static_cast<uint64_t>(epoch) + 1)));
  e.starts.resize(static_cast<size_t>(docs_.size() + 1));
  int64_t at = 0;
  for (int64_t k = 0; k < docs_.size(); ++k) {
    e.starts[static_cast<size_t>(k)] = at;
    at += data_->document_length(document_at(epoch, k));
  }
  e.starts.back() = at;
  return e.starts;
}

int64_t DocumentSamples::document_at(int64_t epoch, int64_t k) const {
  if (!shuffle_) return docs_(k);
  for (const Epoch& e : epochs_)
    if (e.index == epoch) return docs_(e.documents(k));
  LOOM_CHECK(false) << "epoch " << epoch << " is not laid out";
  return -1;
}

Status DocumentSamples::sample(int64_t index, int64_t* out) {
  LOOM_CHECK(index >= 0) << "sample " << index;
  const int64_t epoch = index / per_epoch_;
  int64_t j = index % per_epoch_;
  if (shuffle_)
    j = Permutation(per_epoch_,
                    mix64(seed_ ^ 0xC0FFEEull ^ mix64(static_cast<uint64_t>(epoch))))(j);
  const std::vector<int64_t>& st = starts(epoch);
  int64_t at = j * seq_;
  int64_t k = std::upper_bound(st.begin(), st.end(), at) - st.begin() - 1;
  for (int64_t left = seq_ + 1; left > 0; ++k) {
    const int64_t doc = document_at(epoch, k);
    const int64_t offset = at - st[static_cast<size_t>(k)];
    const int64_t take = std::min(left, data_->document_length(doc) - offset);
    data_->read_document(doc, offset, take, out);
    out += take;
    left -= take;
    at += take;
  }
  return Status::success();
}

BlendedSource::BlendedSource(std::vector<double> weights,
                             std::vector<std::unique_ptr<TokenSource>> sources)
    : weights_(std::move(weights)), sources_(std::move(sources)), counts_(sources_.size(), 0) {
  double total = 0;
  for (double w : weights_) total += w;
  for (double& w : weights_) w /= total;
}

std::pair<size_t, int64_t> BlendedSource::locate(int64_t index) {
  if (index < next_) {
    next_ = 0;
    std::fill(counts_.begin(), counts_.end(), 0);
  }
  for (;; ++next_) {
    size_t best = 0;
    double most = -1e300;
    for (size_t d = 0; d < sources_.size(); ++d) {
      const double lag =
          weights_[d] * static_cast<double>(next_ + 1) - static_cast<double>(counts_[d]);
      if (lag > most) {
        most = lag;
        best = d;
      }
    }
    if (next_ == index) {
      // The counts stand before `index`; taking it moves them past.
      const int64_t local = counts_[best]++;
      ++next_;
      return {best, local};
    }
    ++counts_[best];
  }
}

Status BlendedSource::sample(int64_t index, int64_t* out) {
  const auto [d, local] = locate(index);
  return sources_[d]->sample(local, out);
}

int64_t BlendedSource::samples_per_epoch() const {
  int64_t n = 0;
  for (const auto& s : sources_) n += s->samples_per_epoch();
  return n;
}

Result<std::unique_ptr<TokenFileSource>> TokenFileSource::open(const std::string& path,
                                                               int64_t token_bytes, int64_t vocab,
                                                               int64_t seq) {
  std::unique_ptr<TokenFileSource> s(new TokenFileSource());
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return Error::at(path, "'" + path +
                               "' is a directory; a token file holds the ids of the whole corpus, "
                               "data.token_bytes each");
  auto file = MappedFile::open(path, /*map=*/false);
  if (!file.ok())
    return Error::at(path, "cannot read token file '" + path + "': " + file.error().message);
  s->file_ = std::move(*file);
  s->dtype_ = token_bytes == 2 ? TokenDtype::kUint16 : TokenDtype::kInt32;
  const std::string kind = token_bytes == 2 ? "uint16" : "uint32";
  const int64_t bytes = s->file_->size();
  if (bytes % token_bytes != 0)
    return Error::at(path, "token file '" + path + "' has " + std::to_string(bytes) +
                               " bytes, not a whole number of " + kind + " ids (data.token_bytes " +
                               std::to_string(token_bytes) + ")");
  const int64_t count = bytes / token_bytes;
  if (count < seq + 1)
    return Error::at(path, "token file '" + path + "' holds " + std::to_string(count) +
                               " tokens; one sample needs " + std::to_string(seq + 1));
  // uint32 ids past 2^31 read as negative int32: outside the vocabulary either way.
  int64_t id = 0;
  LOOM_ASSIGN_OR_RETURN(const int64_t byte, first_id_outside(*s->file_, s->dtype_, vocab, &id));
  if (byte >= 0)
    return Error::at(
        path, "token file '" + path + "': token " +
                  std::to_string(token_bytes == 4 ? static_cast<int64_t>(static_cast<uint32_t>(id))
                                                  : id) +
                  " at position " + std::to_string(byte / token_bytes) +
                  " is outside the model's vocabulary (" + std::to_string(vocab) + ")");
  s->seq_ = seq;
  s->windows_ = (count - 1) / seq;
  return s;
}

Status TokenFileSource::sample(int64_t index, int64_t* out) {
  const int64_t offset = (index % windows_) * seq_;
  const int64_t width = width_of(dtype_);
  bytes_.resize(static_cast<size_t>((seq_ + 1) * width));
  if (!file_->read(offset * width, (seq_ + 1) * width, bytes_.data()))
    return Error::at(file_->path(), file_->path() + ": shorter than when it was opened");
  widen(dtype_, bytes_.data(), seq_ + 1, out);
  return Status::success();
}

Status SyntheticSource::sample(int64_t index, int64_t* out) {
  std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index));
  const int64_t start = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab_));
  const int64_t stride = 1 + static_cast<int64_t>(rng() % 7);
  for (int64_t t = 0; t <= seq_; ++t) out[t] = (start + stride * t) % vocab_;
  return Status::success();
}

}  // namespace loom::data
