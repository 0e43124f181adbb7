// The LibTorch-free checkpoint formats: CRC-32 check values, safetensors round trips and
// malformed files, manifests, region assembly across shards (resharding) with coverage and
// value-partial slices, and the durable writer.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "checkpoint/crc32.h"
#include "checkpoint/manifest.h"
#include "checkpoint/merge.h"
#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"
#include "core/durable_file.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}
std::vector<float> as_floats(const std::string& s) {
  std::vector<float> v(s.size() / 4);
  std::memcpy(v.data(), s.data(), s.size());
  return v;
}

TEST(Crc32, CheckValue) {
  EXPECT_EQ(crc32("123456789"), 0xCBF43926u);  // the standard check value of CRC-32/IEEE
  EXPECT_EQ(crc32(""), 0u);
  EXPECT_EQ(crc32(std::string_view("6789"), crc32(std::string_view("12345"))), 0xCBF43926u);
}

TEST(Crc32, EightBytesAtATimeEqualsBitByBit) {
  auto bitwise = [](const std::string& s) {
    uint32_t c = 0xFFFFFFFFu;
    for (unsigned char b : s) {
      c ^= b;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    }
    return ~c;
  };
  std::string data;
  uint32_t x = 12345;
  for (int i = 0; i < 1000; ++i)
    data.push_back(static_cast<char>((x = x * 1103515245u + 12345u) >> 24));
  for (size_t len : {0, 1, 7, 8, 9, 63, 64, 65, 999})
    for (size_t off : {0, 1, 3})
      EXPECT_EQ(crc32(std::string_view(data).substr(off, len)), bitwise(data.substr(off, len)))
          << len << " " << off;
}

TEST(SafeTensors, RoundTrip) {
  SafeTensorsWriter w;
  w.add("a", "F32", {2, 3}, floats({0, 1, 2, 3, 4, 5}));
  w.add("b", "U8", {3}, std::string("xyz"));
  w.set_metadata("step", "7");
  const std::string bytes = w.finish();
  auto f = SafeTensorsFile::parse(bytes, "t.safetensors");
  ASSERT_TRUE(f.ok()) << f.error().message;
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->metadata().at("step"), "7");
  EXPECT_EQ(f->find("a")->shape, (Shape{2, 3}));
  EXPECT_EQ(as_floats(std::string(f->data(*f->find("a")))), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(f->data(*f->find("b")), "xyz");
}

TEST(SafeTensors, MalformedFilesNameTheFileAndProblem) {
  SafeTensorsWriter w;
  w.add("a", "F32", {2}, floats({1, 2}));
  const std::string good = w.finish();
  auto expect_bad = [](const std::string& bytes, const std::string& what) {
    auto f = SafeTensorsFile::parse(bytes, "x.safetensors");
    ASSERT_FALSE(f.ok()) << what;
    EXPECT_NE(f.error().message.find("x.safetensors"), std::string::npos) << f.error().message;
    EXPECT_NE(f.error().message.find(what), std::string::npos) << f.error().message;
  };
  expect_bad(good.substr(0, 5), "truncated");
  expect_bad(good.substr(0, good.size() - 1), "outside");
  std::string huge = good;
  huge[7] = '\x7f';
  expect_bad(huge, "header length");
  auto header = [](const std::string& json, size_t data) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i)
      s[static_cast<size_t>(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
    return s + json + std::string(data, '\0');
  };
  expect_bad(header("[1]", 0), "not a JSON object");
  expect_bad(header(R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})", 4),
             "unknown dtype");
  expect_bad(header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8), "needs 8");
  expect_bad(
      header(
          R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
          8),
      "overlap");
  expect_bad(header(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
             "non-negative");
  // Offsets the wrong way round are not a short file; a float8 tensor is not a broken file.
  auto reversed = SafeTensorsFile::parse(
      header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4), "x.safetensors");
  ASSERT_FALSE(reversed.ok());
  EXPECT_NE(reversed.error().message.find("data_offsets [4, 0] end before they begin"),
            std::string::npos)
      << reversed.error().message;
  EXPECT_EQ(reversed.error().message.find("truncated"), std::string::npos);
  auto fp8 = SafeTensorsFile::parse(
      header(R"({"a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", 4), "x.safetensors");
  ASSERT_FALSE(fp8.ok());
  EXPECT_NE(fp8.error().message.find("tensor 'a': dtype F8_E4M3 is not supported by loom"),
            std::string::npos)
      << fp8.error().message;
  EXPECT_EQ(fp8.error().message.find("not a valid safetensors file"), std::string::npos);
}

// Two shards of a [4, 6] tensor split by columns, read back under another split.
class Reader : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("loom_reader_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (int r = 0; r < 2; ++r) {
      std::vector<float> part;
      for (int i = 0; i < 4; ++i)
        for (int j = 3 * r; j < 3 * r + 3; ++j) part.push_back(static_cast<float>(10 * i + j));
      SafeTensorsWriter w;
      w.add("param/w", "F32", {4, 3}, floats(part));
      const std::string bytes = w.finish();
      const std::string name = "rank_" + std::to_string(r) + ".safetensors";
      ASSERT_TRUE(write_file_durably(dir_ / name, bytes).ok());
      m_.files.push_back({name, bytes.size(), crc32(bytes)});
      m_.slices.push_back(
          {"w", kSliceParam, "F32", {4, 6}, {{0, 4}, {3 * r, 3 * r + 3}}, 0, 1, name, "param/w"});
    }
    m_.world_size = 2;
    write_manifest();
  }
  void write_manifest() { ASSERT_TRUE(write_file_durably(dir_ / kManifestName, to_json(m_)).ok()); }

  fs::path dir_;
  CheckpointManifest m_;
};

TEST_F(Reader, AssemblesAnyRegionFromTheOverlappingShards) {
  auto r = CheckpointReader::open(dir_);
  ASSERT_TRUE(r.ok()) << r.error().message;
  auto rows = r->read("w", kSliceParam, {{1, 3}, {2, 5}});  // crosses both shards
  ASSERT_TRUE(rows.ok()) << rows.error().message;
  EXPECT_EQ(as_floats(*rows), (std::vector<float>{12, 13, 14, 22, 23, 24}));
  auto merged = merge_checkpoint(*r);
  ASSERT_TRUE(merged.ok()) << merged.error().message;
  auto f = SafeTensorsFile::parse(*merged, "merged");
  ASSERT_TRUE(f.ok());
  auto all = as_floats(std::string(f->data(*f->find("w"))));
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 6; ++j) EXPECT_EQ(all[static_cast<size_t>(6 * i + j)], 10 * i + j);
}

// verify() checks every shard as read() would, so `loom checkpoint inspect` vouches for what it
// lists: a flipped data byte (CRC-32), a broken header whose CRC-32 the manifest was given, and a
// slice whose key the shard lacks are each named with the file and what is wrong.
TEST_F(Reader, VerifyNamesTheDamagedShardAndWhatIsWrong) {
  ASSERT_TRUE(CheckpointReader::open(dir_)->verify().ok());
  const fs::path shard = dir_ / "rank_1.safetensors";
  const std::string good = *read_whole_file(shard);
  auto expect_refused = [&](const std::string& what) {
    auto r = CheckpointReader::open(dir_);
    ASSERT_TRUE(r.ok()) << r.error().message;  // sizes match: only reading the shard tells
    Status s = r->verify();
    ASSERT_FALSE(s.ok()) << what;
    EXPECT_NE(s.error().message.find(shard.string()), std::string::npos) << s.error().message;
    EXPECT_NE(s.error().message.find(what), std::string::npos) << s.error().message;
  };
  std::string flipped = good;
  flipped.back() ^= 0x40;
  ASSERT_TRUE(write_file_durably(shard, flipped).ok());
  expect_refused("is corrupted: CRC-32 " + [&] {
    char hex[9];
    std::snprintf(hex, sizeof hex, "%08x", crc32(flipped));
    return std::string(hex);
  }());

  std::string header = good;
  header[9] = '[';  // the JSON header no longer parses
  ASSERT_TRUE(write_file_durably(shard, header).ok());
  m_.files[1].crc32 = crc32(header);
  write_manifest();
  expect_refused("header");

  ASSERT_TRUE(write_file_durably(shard, good).ok());
  m_.files[1].crc32 = crc32(good);
  m_.slices[1].key = "param/absent";
  write_manifest();
  expect_refused("has no tensor 'param/absent'");
}

TEST_F(Reader, FilesAreTheShardsAndTheManifestOrTheMergedFile) {
  auto r = CheckpointReader::open(dir_);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->files(), (std::vector<fs::path>{dir_ / "rank_0.safetensors",
                                               dir_ / "rank_1.safetensors", dir_ / kManifestName}));
  ASSERT_TRUE(write_file_durably(dir_ / "merged.safetensors", *merge_checkpoint(*r)).ok());
  auto m = CheckpointReader::open(dir_ / "merged.safetensors");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->files(), (std::vector<fs::path>{dir_ / "merged.safetensors"}));
  EXPECT_TRUE(m->verify().ok());
}

TEST_F(Reader, AMergedFileIsACheckpointToo) {
  auto r = CheckpointReader::open(dir_);
  ASSERT_TRUE(r.ok());
  auto merged = merge_checkpoint(*r);
  ASSERT_TRUE(merged.ok());
  ASSERT_TRUE(write_file_durably(dir_ / "merged.safetensors", *merged).ok());
  auto m = CheckpointReader::open(dir_ / "merged.safetensors");
  ASSERT_TRUE(m.ok()) << m.error().message;
  auto rows = m->read("w", kSliceParam, {{1, 3}, {2, 5}});
  ASSERT_TRUE(rows.ok()) << rows.error().message;
  EXPECT_EQ(as_floats(*rows), (std::vector<float>{12, 13, 14, 22, 23, 24}));
  // A safetensors file that loom did not merge is refused, naming it.
  SafeTensorsWriter foreign;
  foreign.add("w", "F32", {1}, floats({1}));
  ASSERT_TRUE(write_file_durably(dir_ / "foreign.safetensors", foreign.finish()).ok());
  auto f = CheckpointReader::open(dir_ / "foreign.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("foreign.safetensors"), std::string::npos) << f.error().message;
  EXPECT_NE(f.error().message.find("not a merged loom checkpoint"), std::string::npos)
      << f.error().message;
}

TEST_F(Reader, ARegionStoredNowhereOrOnlyAsPartialSumsIsAnError) {
  m_.slices[1].value_chunks = 2;
  write_manifest();
  auto r = CheckpointReader::open(dir_);
  ASSERT_TRUE(r.ok());
  auto left = r->read("w", kSliceParam, {{0, 4}, {0, 3}});
  EXPECT_TRUE(left.ok());
  auto right = r->read("w", kSliceParam, {{0, 4}, {2, 5}});
  ASSERT_FALSE(right.ok());
  EXPECT_NE(right.error().message.find("'w'"), std::string::npos) << right.error().message;
  EXPECT_NE(right.error().message.find("value-partial"), std::string::npos)
      << right.error().message;
}

TEST_F(Reader, LatestIsTheNewestCompleteCheckpoint) {
  const fs::path root = dir_ / "root";
  fs::remove_all(root);
  fs::create_directories(root / checkpoint_dir_name(3));
  fs::create_directories(root / checkpoint_dir_name(9));  // no manifest: incomplete
  std::ofstream(root / checkpoint_dir_name(3) / kManifestName) << "{}";
  EXPECT_EQ(latest_checkpoint(root), root / "step_00000003");
  EXPECT_TRUE(latest_checkpoint(root / "absent").empty());
  // Past 10^8 steps the name grows a digit and still counts, and sorts by step, not by name.
  fs::create_directories(root / checkpoint_dir_name(123456789));
  std::ofstream(root / checkpoint_dir_name(123456789) / kManifestName) << "{}";
  EXPECT_EQ(latest_checkpoint(root), root / "step_123456789");
}

TEST(CheckpointDirName, RoundTripsAndRefusesOtherNames) {
  for (int64_t step : {0LL, 5LL, 99999999LL, 100000000LL, 123456789012LL})
    EXPECT_EQ(parse_checkpoint_dir_name(checkpoint_dir_name(step)), step);
  for (const char* other : {"step_1", "step_0000000x", "stop_00000001", "step_", "rank_00000001"})
    EXPECT_FALSE(parse_checkpoint_dir_name(other).has_value()) << other;
}

TEST(Manifest, RoundTripAndErrors) {
  CheckpointManifest m;
  m.step = 4;
  m.files.push_back({"rank_0.safetensors", 10, 0xdeadbeef});
  m.slices.push_back(
      {"w", kSliceParam, "F32", {4, 6}, {{0, 4}, {0, 3}}, 0, 1, "rank_0.safetensors", "k"});
  auto back = parse_manifest(to_json(m), "m.json");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->files[0].crc32, 0xdeadbeefu);
  EXPECT_EQ(back->slices[0].ranges, m.slices[0].ranges);
  m.slices[0].ranges[1] = {0, 7};
  auto bad = parse_manifest(to_json(m), "m.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("m.json"), std::string::npos);
  EXPECT_NE(bad.error().message.find("'w'"), std::string::npos) << bad.error().message;
  m.slices[0].ranges[1] = {0, 3};
  m.slices[0].file = "../../etc/passwd";
  EXPECT_FALSE(parse_manifest(to_json(m), "m.json").ok());
}

TEST(DurableFile, ReplacesAtomically) {
  const fs::path p = fs::path(::testing::TempDir()) / "loom_durable.txt";
  ASSERT_TRUE(write_file_durably(p, "one").ok());
  int stages = 0;
  ASSERT_TRUE(write_file_durably(p, "two!", [&](const char*) { ++stages; }).ok());
  EXPECT_EQ(*read_whole_file(p), "two!");
  EXPECT_EQ(stages, 3);  // half-written, synced, renamed
  EXPECT_FALSE(fs::exists(p.string() + ".tmp"));
  auto missing = write_file_durably(fs::path("/nonexistent_dir") / "f", "x");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("/nonexistent_dir/f"), std::string::npos)
      << missing.error().message;
}

}  // namespace
}  // namespace loom
