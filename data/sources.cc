#include "data/sources.h"

#include <map>

namespace loom::data {
namespace {

// A file's own error under the key that named the file.
Error under(const Config& config, const std::string& key, const Error& e) {
  return config.error(key, e.message);
}

// Validation samples of a synthetic run: indices far past any training run's.
class OffsetSource : public TokenSource {
 public:
  OffsetSource(std::unique_ptr<TokenSource> inner, int64_t offset)
      : inner_(std::move(inner)), offset_(offset) {}
  Status sample(int64_t index, int64_t* out) override {
    return inner_->sample(index + offset_, out);
  }
  int64_t samples_per_epoch() const override { return inner_->samples_per_epoch(); }

 private:
  std::unique_ptr<TokenSource> inner_;
  int64_t offset_;
};

struct Opened {
  std::map<std::string, std::shared_ptr<const IndexedDataset>> by_prefix;
};

// Opens (once) and checks the dataset at `prefix`, named by `key`.
Result<std::shared_ptr<const IndexedDataset>> open_checked(const Config& config, Opened& opened,
                                                           const std::string& key,
                                                           const std::string& prefix,
                                                           int64_t vocab) {
  auto it = opened.by_prefix.find(prefix);
  if (it != opened.by_prefix.end()) return it->second;
  for (const char* suffix : {".bin", ".idx"})
    if (prefix.size() > 4 && prefix.compare(prefix.size() - 4, 4, suffix) == 0)
      return config.error(key, "'" + prefix + "' ends in " + suffix +
                                   "; name the dataset by its PREFIX (PREFIX.bin and PREFIX.idx)");
  auto data = IndexedDataset::open(prefix);
  if (!data.ok()) return under(config, key, data.error());
  if (Status s = (*data)->check_ids(vocab); !s.ok()) return under(config, key, s.error());
  opened.by_prefix[prefix] = *data;
  return *data;
}

// Samples of the datasets `entries` (one: no blend) over their documents of `side`.
enum class Side { kAll, kTrain, kHeldOut };

Result<std::unique_ptr<TokenSource>> indexed_source(const Config& config, Opened& opened,
                                                    const std::string& key,
                                                    const std::vector<BlendEntry>& entries,
                                                    Side side, bool shuffle, int64_t vocab,
                                                    int64_t seq, uint64_t seed) {
  std::vector<std::unique_ptr<TokenSource>> sources;
  std::vector<double> weights;
  for (size_t i = 0; i < entries.size(); ++i) {
    LOOM_ASSIGN_OR_RETURN(auto data, open_checked(config, opened, key, entries[i].path, vocab));
    // Each dataset of a blend its own order.
    const uint64_t own_seed = mix64(seed + 0x100 * i);
    DocumentSet docs = DocumentSet::all(data->documents());
    if (side != Side::kAll) {
      auto split = DocumentSet::split(data->documents(), config.eval.split, mix64(seed + i),
                                      side == Side::kHeldOut);
      if (!split.ok())
        return config.error("eval.split", entries[i].path + ": " + split.error().message);
      docs = *split;
    }
    auto samples = DocumentSamples::make(data, docs, seq, own_seed, shuffle);
    if (!samples.ok())
      return config.error(
          side == Side::kHeldOut ? "eval.split" : key,
          samples.error().message +
              (side == Side::kHeldOut ? " (the documents eval.split holds out)" : ""));
    sources.push_back(std::move(*samples));
    weights.push_back(entries[i].weight);
  }
  if (sources.size() == 1) return std::move(sources[0]);
  return std::unique_ptr<TokenSource>(
      std::make_unique<BlendedSource>(std::move(weights), std::move(sources)));
}

Result<std::unique_ptr<TokenSource>> token_file(const Config& config, const std::string& key,
                                                const std::string& path, int64_t vocab,
                                                int64_t seq) {
  auto s = TokenFileSource::open(path, config.data.token_bytes, vocab, seq);
  if (!s.ok()) return under(config, key, s.error());
  return std::unique_ptr<TokenSource>(std::move(*s));
}

}  // namespace

Result<DataSources> open_sources(const Config& config, int64_t vocab, int64_t seq) {
  const DataConfig& d = config.data;
  const EvalConfig& e = config.eval;
  const uint64_t seed = config.data_seed();
  DataSources out;
  if (d.type == "synthetic") {
    out.train =
        std::make_unique<SyntheticSource>(static_cast<uint64_t>(config.run.seed), vocab, seq);
    if (e.every > 0)
      out.validation = std::make_unique<OffsetSource>(
          std::make_unique<SyntheticSource>(static_cast<uint64_t>(config.run.seed), vocab, seq),
          int64_t{1} << 50);
    return out;
  }
  if (d.type == "tokens") {
    LOOM_ASSIGN_OR_RETURN(out.train, token_file(config, "data.path", d.path, vocab, seq));
    if (e.every == 0) return out;
    LOOM_ASSIGN_OR_RETURN(out.validation, token_file(config, "eval.data", e.data, vocab, seq));
    return out;
  }
  Opened opened;
  const std::string key = d.blend.empty() ? "data.path" : "data.blend";
  const std::vector<BlendEntry> entries =
      d.blend.empty() ? std::vector<BlendEntry>{BlendEntry{1.0, d.path}} : d.blend;
  const Side train_side = e.every > 0 && e.split > 0 ? Side::kTrain : Side::kAll;
  LOOM_ASSIGN_OR_RETURN(out.train, indexed_source(config, opened, key, entries, train_side,
                                                  d.shuffle, vocab, seq, seed));
  if (e.every == 0) return out;
  // Validation reads its documents in order: a fixed set of batches, the same at every
  // validation, which a reference implementation recomputes without loom's orders.
  if (!e.data.empty()) {
    LOOM_ASSIGN_OR_RETURN(out.validation,
                          indexed_source(config, opened, "eval.data", {BlendEntry{1.0, e.data}},
                                         Side::kAll, /*shuffle=*/false, vocab, seq, seed));
  } else {
    LOOM_ASSIGN_OR_RETURN(out.validation,
                          indexed_source(config, opened, key, entries, Side::kHeldOut,
                                         /*shuffle=*/false, vocab, seq, seed));
  }
  return out;
}

Result<std::unique_ptr<TokenSource>> make_token_source(const Config& config, int64_t vocab,
                                                       int64_t seq) {
  Config train_only = config;
  train_only.eval = EvalConfig{};
  LOOM_ASSIGN_OR_RETURN(DataSources s, open_sources(train_only, vocab, seq));
  return std::move(s.train);
}

}  // namespace loom::data
