#include "data/indexed_dataset.h"

#include <gtest/gtest.h>

#include "tests/data/dataset_writer.h"

namespace loom::data {
namespace {

using testing::Documents;

std::string temp(const std::string& name) { return ::testing::TempDir() + "loom_data_" + name; }

std::vector<int64_t> document(const IndexedDataset& d, int64_t k) {
  std::vector<int64_t> ids(static_cast<size_t>(d.document_length(k)));
  d.read_document(k, 0, static_cast<int64_t>(ids.size()), ids.data());
  return ids;
}

// Every dtype Megatron writes token ids in reads back id for id, documents of one sequence and
// of several alike.
TEST(IndexedDataset, ReadsWhatTheFormatsDefinitionWrites) {
  const Documents docs = {{{5, 6, 7}}, {{1}, {2, 3}, {}}, {{}}, {{9, 9, 9, 9}}};
  struct Kind {
    uint8_t code;
    int width;
    TokenDtype dtype;
  };
  for (const Kind k : {Kind{1, 1, TokenDtype::kUint8}, Kind{8, 2, TokenDtype::kUint16},
                       Kind{4, 4, TokenDtype::kInt32}, Kind{5, 8, TokenDtype::kInt64}}) {
    const std::string prefix = temp("rt" + std::to_string(k.code));
    testing::write_dataset(prefix, docs, k.code, k.width);
    auto d = IndexedDataset::open(prefix);
    ASSERT_TRUE(d.ok()) << d.error().message;
    EXPECT_EQ((*d)->dtype(), k.dtype);
    EXPECT_EQ((*d)->documents(), 4);
    EXPECT_EQ((*d)->sequences(), 6);
    EXPECT_EQ((*d)->tokens(), 10);
    EXPECT_EQ(document(**d, 0), (std::vector<int64_t>{5, 6, 7}));
    EXPECT_EQ(document(**d, 1), (std::vector<int64_t>{1, 2, 3}));
    EXPECT_EQ(document(**d, 2), (std::vector<int64_t>{}));
    EXPECT_EQ(document(**d, 3), (std::vector<int64_t>{9, 9, 9, 9}));
    // A part of a document that spans its sequences.
    std::vector<int64_t> part(2);
    (*d)->read_document(1, 1, 2, part.data());
    EXPECT_EQ(part, (std::vector<int64_t>{2, 3}));
  }
}

// Large ids survive: uint16 up to 65535, int32 past it (Llama 3's 128256 vocabulary).
TEST(IndexedDataset, WideIds) {
  const std::string prefix = temp("wide");
  testing::write_dataset(prefix, {{{65535, 128255, 0}}}, 4, 4);
  auto d = IndexedDataset::open(prefix);
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(document(**d, 0), (std::vector<int64_t>{65535, 128255, 0}));
  EXPECT_TRUE((*d)->check_ids(128256).ok());
  Status s = (*d)->check_ids(128000);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find(prefix + ".bin: token id 128255 in document 0 (sequence 0, "
                                            "position 1) is outside the model's vocabulary "
                                            "[0, 128000)"),
            std::string::npos)
      << s.error().message;
}

// An id past the vocabulary deep in a later document is found and placed.
TEST(IndexedDataset, IdOutsideTheVocabularyIsNamedByDocument) {
  const std::string prefix = temp("oov");
  Documents docs;
  for (int k = 0; k < 50; ++k) docs.push_back({{1, 2, 3, 4}});
  docs[37][0][2] = 500;
  testing::write_dataset(prefix, docs);
  auto d = IndexedDataset::open(prefix);
  ASSERT_TRUE(d.ok());
  Status s = (*d)->check_ids(256);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("token id 500 in document 37 (sequence 37, position 2)"),
            std::string::npos)
      << s.error().message;
  EXPECT_TRUE((*d)->check_ids(501).ok());
}

// Each broken file is refused naming the file and what is wrong with it.
TEST(IndexedDataset, BrokenFilesAreNamed) {
  const std::string prefix = temp("bad");
  const Documents docs = {{{1, 2, 3}}, {{4, 5}}};
  auto refuse = [&](const std::string& file, const std::string& bytes, const std::string& expect) {
    testing::write_dataset(prefix, docs);
    testing::write_file(prefix + file, bytes);
    auto d = IndexedDataset::open(prefix);
    ASSERT_FALSE(d.ok()) << expect;
    EXPECT_NE(d.error().message.find(prefix + file), std::string::npos) << d.error().message;
    EXPECT_NE(d.error().message.find(expect), std::string::npos) << d.error().message;
  };
  testing::write_dataset(prefix, docs);
  const std::string idx = testing::read_file(prefix + ".idx");
  const std::string bin = testing::read_file(prefix + ".bin");
  refuse(".idx", idx.substr(0, 20), "truncated");
  refuse(".idx", idx.substr(0, idx.size() - 8), "truncated");
  refuse(".idx", idx + std::string(3, '\0'), "a truncated or padded index");
  std::string magic = idx;
  magic[0] = 'X';
  refuse(".idx", magic, "not a Megatron indexed dataset");
  std::string version = idx;
  version[9] = 2;
  refuse(".idx", version, "index version 2");
  std::string code = idx;
  code[17] = 9;
  refuse(".idx", code, "unknown dtype code 9");
  code[17] = 7;
  refuse(".idx", code, "dtype float32 cannot hold token ids");
  // The second sequence's pointer (byte 34 + 2*4 + 8) past the data file.
  std::string pointer = idx;
  pointer[34 + 8 + 8] = 100;
  refuse(".idx", pointer, "places sequence 1 (2 tokens at byte 100) outside");
  std::string length = idx;
  length[34] = 50;
  refuse(".idx", length, "places sequence 0 (50 tokens at byte 0) outside");
  std::string counts = idx;
  counts[18] = 0x7f;  // sequence count far past the file
  refuse(".idx", counts, "truncated: its header counts");
  std::string docidx = idx;
  docidx[34 + 2 * 12 + 8] = 5;  // document index 1 past the sequence count
  refuse(".idx", docidx, "document index 1 is 5");
  refuse(".bin", bin.substr(0, bin.size() - 1), "not a whole number of uint16 ids");
  refuse(".bin", bin.substr(0, bin.size() - 2), ".bin: 8 bytes, but");
  // A missing file.
  testing::write_dataset(prefix, docs);
  std::remove((prefix + ".bin").c_str());
  auto missing = IndexedDataset::open(prefix);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find(prefix + ".bin: cannot open"), std::string::npos)
      << missing.error().message;
  // An empty dataset: no documents, or documents without tokens.
  testing::write_dataset(prefix, {});
  auto none = IndexedDataset::open(prefix);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("an empty dataset"), std::string::npos);
  testing::write_dataset(prefix, {{{}}, {{}}});
  auto hollow = IndexedDataset::open(prefix);
  ASSERT_FALSE(hollow.ok());
  EXPECT_NE(hollow.error().message.find("hold no tokens"), std::string::npos);
}

// Megatron's multimodal datasets append a mode byte per sequence; they read like the rest.
TEST(IndexedDataset, TrailingSequenceModesAreAccepted) {
  const std::string prefix = temp("modes");
  testing::write_dataset(prefix, {{{1, 2}}, {{3}}});
  testing::write_file(prefix + ".idx", testing::read_file(prefix + ".idx") + std::string(2, '\0'));
  auto d = IndexedDataset::open(prefix);
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(document(**d, 1), (std::vector<int64_t>{3}));
}

}  // namespace
}  // namespace loom::data
