#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "data/permutation.h"
#include "data/sources.h"
#include "data/token_source.h"
#include "tests/data/dataset_writer.h"

namespace loom::data {
namespace {

using testing::Documents;

std::string temp(const std::string& name) { return ::testing::TempDir() + "loom_samples_" + name; }

// Documents whose ids say where they are: document k holds k*1000 + t at position t, so a
// sample's ids name the documents and positions it was cut from.
Documents numbered(int64_t count, std::mt19937& rng) {
  Documents docs;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 40);
    std::vector<int64_t> ids;
    for (int64_t t = 0; t < n; ++t) ids.push_back(k * 1000 + t);
    docs.push_back({ids});
  }
  return docs;
}

std::shared_ptr<const IndexedDataset> open_numbered(const std::string& name, int64_t count,
                                                    uint32_t seed, int64_t* tokens = nullptr) {
  std::mt19937 rng(seed);
  const Documents docs = numbered(count, rng);
  testing::write_dataset(temp(name), docs, 4, 4);
  auto d = IndexedDataset::open(temp(name));
  EXPECT_TRUE(d.ok()) << d.error().message;
  if (tokens) *tokens = (*d)->tokens();
  return *d;
}

std::vector<int64_t> sample(TokenSource& s, int64_t index, int64_t seq) {
  std::vector<int64_t> out(static_cast<size_t>(seq + 1));
  EXPECT_TRUE(s.sample(index, out.data()).ok());
  return out;
}

TEST(Permutation, IsABijectionForEverySize) {
  for (int64_t n : {0, 1, 2, 3, 5, 16, 17, 100, 1000, 4097}) {
    Permutation p(n, 42);
    std::vector<int64_t> seen;
    for (int64_t i = 0; i < n; ++i) seen.push_back(p(i));
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> all(static_cast<size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(seen, all) << "n " << n;
  }
  // Seeded: the same seed the same order, another seed another.
  Permutation a(1000, 1), b(1000, 1), c(1000, 2);
  int64_t same = 0, moved = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    same += a(i) == b(i);
    moved += a(i) != c(i);
  }
  EXPECT_EQ(same, 1000);
  EXPECT_GT(moved, 900);  // a random pair of orders agrees at about one position
}

// Without shuffling, sample j is tokens [j*seq, j*seq + seq] of the documents laid end to end,
// across document boundaries; epochs repeat.
TEST(DocumentSamples, InOrderSamplesTileTheTokenStream) {
  int64_t tokens = 0;
  auto data = open_numbered("order", 30, 1, &tokens);
  std::vector<int64_t> stream(static_cast<size_t>(tokens));
  for (int64_t k = 0, at = 0; k < data->documents(); ++k) {
    data->read_document(k, 0, data->document_length(k), stream.data() + at);
    at += data->document_length(k);
  }
  const int64_t seq = 16;
  auto s = DocumentSamples::make(data, DocumentSet::all(data->documents()), seq, 7, false);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ((*s)->samples_per_epoch(), (tokens - 1) / seq);
  for (int64_t j = 0; j < (*s)->samples_per_epoch(); ++j) {
    const std::vector<int64_t> expect(stream.begin() + j * seq, stream.begin() + j * seq + seq + 1);
    ASSERT_EQ(sample(**s, j, seq), expect) << "sample " << j;
    ASSERT_EQ(sample(**s, j + 2 * (*s)->samples_per_epoch(), seq), expect);
  }
}

// Shuffled: each epoch lays the documents in its own order and visits every window of it once;
// a sample is a pure function of its index (any order of asking, any instance), which is what
// makes every plan see one device's data.
TEST(DocumentSamples, ShuffledEpochsVisitEveryWindowOnceInASeededOrder) {
  auto data = open_numbered("shuffle", 200, 2);
  const int64_t seq = 8;
  auto make = [&](uint64_t seed) {
    auto s = DocumentSamples::make(data, DocumentSet::all(data->documents()), seq, seed, true);
    EXPECT_TRUE(s.ok());
    return std::move(s).value();
  };
  auto a = make(5), b = make(5), c = make(6);
  const int64_t n = a->samples_per_epoch();
  std::vector<std::vector<int64_t>> epoch0, epoch1;
  for (int64_t j = 0; j < n; ++j) epoch0.push_back(sample(*a, j, seq));
  for (int64_t j = 0; j < n; ++j) epoch1.push_back(sample(*a, n + j, seq));
  // Asked backwards, and by another instance: the same samples.
  for (int64_t j = n - 1; j >= 0; --j)
    ASSERT_EQ(sample(*b, j, seq), epoch0[static_cast<size_t>(j)]);
  // Within an epoch, each token (but the windows' shared ends) appears in exactly one sample.
  for (const auto* epoch : {&epoch0, &epoch1}) {
    std::multiset<int64_t> inputs;
    for (const auto& s : *epoch) inputs.insert(s.begin(), s.end() - 1);
    EXPECT_EQ(static_cast<int64_t>(inputs.size()), n * seq);
    EXPECT_EQ(std::set<int64_t>(inputs.begin(), inputs.end()).size(), inputs.size());
  }
  // Consecutive ids within a sample come from one document read in order, or cross to the start
  // of another.
  for (const auto& s : epoch0)
    for (size_t t = 1; t < s.size(); ++t)
      ASSERT_TRUE(s[t] == s[t - 1] + 1 || s[t] % 1000 == 0) << s[t - 1] << " -> " << s[t];
  EXPECT_NE(epoch0, epoch1);  // each epoch its own order
  int64_t differ = 0;
  for (int64_t j = 0; j < n; ++j) differ += sample(*c, j, seq) != epoch0[static_cast<size_t>(j)];
  EXPECT_GT(differ, n * 9 / 10);  // another seed, another order
  // Not the file order.
  auto in_order = DocumentSamples::make(data, DocumentSet::all(data->documents()), seq, 5, false);
  int64_t same = 0;
  for (int64_t j = 0; j < n; ++j)
    same += sample(**in_order, j, seq) == epoch0[static_cast<size_t>(j)];
  EXPECT_LT(same, n / 10);
}

TEST(DocumentSamples, ASequenceLongerThanTheDatasetIsRefused) {
  const std::string prefix = temp("short");
  testing::write_dataset(prefix, {{{1, 2, 3}}, {{4}}});
  auto d = IndexedDataset::open(prefix);
  ASSERT_TRUE(d.ok());
  auto s = DocumentSamples::make(*d, DocumentSet::all(2), 4, 1, true);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find(prefix + ": 2 documents of 4 tokens in all; one sample needs "
                                            "seq + 1 = 5"),
            std::string::npos)
      << s.error().message;
  EXPECT_TRUE(DocumentSamples::make(*d, DocumentSet::all(2), 3, 1, true).ok());
}

// The held-out documents and the rest split the dataset exactly, the same way for every seed
// use, and a validation sample holds held-out documents only.
TEST(DocumentSet, SplitHoldsOutDocumentsBySeed) {
  auto held = DocumentSet::split(1000, 0.05, 9, true);
  auto rest = DocumentSet::split(1000, 0.05, 9, false);
  ASSERT_TRUE(held.ok() && rest.ok());
  EXPECT_EQ(held->size(), 50);
  EXPECT_EQ(rest->size(), 950);
  std::set<int64_t> all;
  for (int64_t j = 0; j < held->size(); ++j) all.insert((*held)(j));
  for (int64_t j = 0; j < rest->size(); ++j) all.insert((*rest)(j));
  EXPECT_EQ(all.size(), 1000u);
  // Not the first or last 50: chosen, not cut.
  int64_t low = 0;
  for (int64_t j = 0; j < held->size(); ++j) low += (*held)(j) < 50;
  EXPECT_LT(low, 20);
  EXPECT_EQ(DocumentSet::split(10, 0.001, 1, true)->size(), 1);  // at least one
  EXPECT_FALSE(DocumentSet::split(1, 0.5, 1, true).ok());        // none left to train on

  auto data = open_numbered("split", 100, 3);
  auto val = DocumentSamples::make(data, *DocumentSet::split(100, 0.1, 4, true), 4, 1, true);
  auto train = DocumentSamples::make(data, *DocumentSet::split(100, 0.1, 4, false), 4, 1, true);
  ASSERT_TRUE(val.ok() && train.ok());
  std::set<int64_t> held_docs, val_docs, train_docs;
  auto split = *DocumentSet::split(100, 0.1, 4, true);
  for (int64_t j = 0; j < split.size(); ++j) held_docs.insert(split(j));
  for (int64_t i = 0; i < 3 * (*val)->samples_per_epoch(); ++i)
    for (int64_t id : sample(**val, i, 4)) val_docs.insert(id / 1000);
  for (int64_t i = 0; i < (*train)->samples_per_epoch(); ++i)
    for (int64_t id : sample(**train, i, 4)) train_docs.insert(id / 1000);
  EXPECT_EQ(val_docs, held_docs);
  for (int64_t k : train_docs) EXPECT_EQ(held_docs.count(k), 0u) << "document " << k;
  EXPECT_EQ(train_docs.size() + held_docs.size(), 100u);
}

// A blend gives each dataset its weight's share of every prefix of the samples (to within one
// sample: Megatron's greedy rule), takes each dataset's samples in its own order, and answers
// any index asked in any order alike.
TEST(BlendedSource, ProportionsAndOrderAreExact) {
  auto make = [&]() {
    std::vector<std::unique_ptr<TokenSource>> sources;
    for (int i = 0; i < 3; ++i) {
      auto d = open_numbered("blend" + std::to_string(i), 40, 10 + static_cast<uint32_t>(i));
      auto s = DocumentSamples::make(d, DocumentSet::all(40), 4, 1, true);
      sources.push_back(std::move(s).value());
    }
    return std::make_unique<BlendedSource>(std::vector<double>{5, 3, 2}, std::move(sources));
  };
  auto blend = make();
  const std::vector<double> share = {0.5, 0.3, 0.2};
  std::vector<int64_t> counts(3, 0);
  for (int64_t i = 0; i < 5000; ++i) {
    const auto [d, local] = blend->locate(i);
    ASSERT_EQ(local, counts[d]) << "sample " << i;  // each dataset's samples in its order
    ++counts[d];
    for (size_t k = 0; k < 3; ++k)
      ASSERT_LE(std::abs(static_cast<double>(counts[k]) - share[k] * static_cast<double>(i + 1)),
                1.0)
          << "dataset " << k << " after " << i + 1 << " samples";
  }
  auto other = make();
  for (int64_t i : {4999, 17, 2500, 0, 4998})
    EXPECT_EQ(sample(*other, i, 4), sample(*blend, i, 4)) << "sample " << i;
}

Config config(const std::vector<std::string>& overrides) {
  auto c = parse_config("", "t.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return c.ok() ? *c : Config{};
}

// data.* and eval.* name what is wrong with them, and the files named are checked whole.
TEST(Sources, ConfigMistakesAndBadFilesNameTheirKey) {
  auto refused = [](const std::vector<std::string>& overrides, const std::string& key,
                    const std::string& words) {
    auto c = parse_config("", "t.yaml", overrides);
    ASSERT_FALSE(c.ok()) << words;
    EXPECT_NE(c.error().message.find(key), std::string::npos) << c.error().message;
    EXPECT_NE(c.error().message.find(words), std::string::npos) << c.error().message;
  };
  refused({"data.type=indexed"}, "data.path", "neither data.path");
  refused({"data.type=indexed", "data.path=a", "data.blend=[[1, b]]"}, "data.blend", "both given");
  refused({"data.blend=[[1, b]]"}, "data.blend", "data.type is 'synthetic'");
  refused({"data.type=indexed", "data.blend=[[0, b]]"}, "data.blend", "positive number");
  refused({"data.type=indexed", "data.blend=[b, c]"}, "data.blend", "[weight, PREFIX] pairs");
  refused({"data.type=indexed", "data.path=a", "eval.split=0.1"}, "eval.split", "eval.every is 0");
  refused({"data.type=indexed", "data.path=a", "eval.every=5"}, "eval.every", "no validation data");
  refused({"data.type=indexed", "data.path=a", "eval.every=5", "eval.split=0.1", "eval.data=b"},
          "eval.split", "both given");
  refused({"data.type=indexed", "data.path=a", "eval.every=5", "eval.split=1"}, "eval.split",
          "[0, 1)");
  refused({"data.type=tokens", "data.path=a", "eval.every=5", "eval.split=0.1"}, "eval.split",
          "a flat token file has none");
  refused({"eval.every=5", "eval.data=x"}, "eval.data", "synthetic samples of their own");

  int64_t tokens = 0;
  open_numbered("cfg", 20, 5, &tokens);
  auto ok = open_sources(
      config({"data.type=indexed", "data.path=" + temp("cfg"), "eval.every=2", "eval.split=0.2"}),
      20000, 4);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_TRUE(ok->train && ok->validation);
  auto vocab = open_sources(config({"data.type=indexed", "data.path=" + temp("cfg")}), 1000, 4);
  ASSERT_FALSE(vocab.ok());
  EXPECT_NE(vocab.error().message.find("data.path: " + temp("cfg") + ".bin: token id 1000"),
            std::string::npos)
      << vocab.error().message;
  auto longer =
      open_sources(config({"data.type=indexed", "data.path=" + temp("cfg")}), 20000, tokens);
  ASSERT_FALSE(longer.ok());
  EXPECT_NE(longer.error().message.find("one sample needs seq + 1"), std::string::npos)
      << longer.error().message;
  auto suffix =
      open_sources(config({"data.type=indexed", "data.path=" + temp("cfg") + ".bin"}), 20000, 4);
  ASSERT_FALSE(suffix.ok());
  EXPECT_NE(suffix.error().message.find("name the dataset by its PREFIX"), std::string::npos);
  auto missing = open_sources(config({"data.type=indexed", "data.blend=[[1, " + temp("cfg") +
                                                               "], [2, " + temp("nowhere") + "]]"}),
                              20000, 4);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("data.blend: " + temp("nowhere") + ".idx: cannot open"),
            std::string::npos)
      << missing.error().message;
}

}  // namespace
}  // namespace loom::data
