// Hugging Face folders: a single file and a sharded index, regions read as byte ranges and
// converted from F32, BF16 and F16, and errors that name the file and tensor.
#include "checkpoint/hf_folder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/safetensors.h"
#include "core/durable_file.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string f32(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}
// bfloat16 of values exactly representable in it (the top half of the float's bits).
std::string bf16(const std::vector<float>& v) {
  std::string out;
  for (float x : v) {
    uint32_t bits = 0;
    std::memcpy(&bits, &x, 4);
    const uint16_t top = static_cast<uint16_t>(bits >> 16);
    out.append(reinterpret_cast<const char*>(&top), 2);
  }
  return out;
}

// w[i, j] = 100 i + j over [rows, cols].
std::vector<float> grid(int64_t rows, int64_t cols) {
  std::vector<float> v;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v.push_back(static_cast<float>(100 * i + j));
  return v;
}

class HfFolderTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::path(::testing::TempDir()) /
        ("loom_hf_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ASSERT_TRUE(write_file_durably(dir_ / "config.json", R"({"model_type": "gpt2"})").ok());
  }
  void write(const std::string& file, const SafeTensorsWriter& w) {
    ASSERT_TRUE(write_file_durably(dir_ / file, w.finish()).ok());
  }
  fs::path dir_;
};

TEST_F(HfFolderTest, ReadsRegionsOfOneFile) {
  SafeTensorsWriter w;
  w.add("a", "F32", {5, 7}, f32(grid(5, 7)));
  w.add("b", "BF16", {3, 4}, bf16(grid(3, 4)));
  w.add("c", "F32", {2, 3, 4}, f32(grid(6, 4)));
  write("model.safetensors", w);
  auto folder = HfFolder::open(dir_);
  ASSERT_TRUE(folder.ok()) << folder.error().message;
  EXPECT_EQ(folder->tensor_names(), (std::vector<std::string>{"a", "b", "c"}));
  // Columns 2..5 of rows 1..3: one read per row.
  auto a = folder->read("a", {{1, 3}, {2, 5}});
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(*a, (std::vector<float>{102, 103, 104, 202, 203, 204}));
  auto b = folder->read("b", {{2, 3}, {0, 4}});
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(*b, (std::vector<float>{200, 201, 202, 203}));
  // Whole trailing dimensions read as one run.
  auto c = folder->read("c", {{1, 2}, {0, 3}, {0, 4}});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(*c, (std::vector<float>{300, 301, 302, 303, 400, 401, 402, 403, 500, 501, 502, 503}));
  auto c2 = folder->read("c", {{0, 2}, {1, 2}, {3, 4}});
  ASSERT_TRUE(c2.ok()) << c2.error().message;
  EXPECT_EQ(*c2, (std::vector<float>{103, 403}));
  // Only the region's bytes: 6 + 4 (bf16, 2 bytes each) + 12 + 2 elements so far.
  EXPECT_EQ(folder->bytes_read(), 6u * 4 + 4u * 2 + 12u * 4 + 2u * 4);
  auto whole = folder->read("a", {{0, 5}, {0, 7}});
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(*whole, grid(5, 7));
}

TEST_F(HfFolderTest, ReadsShardsThroughTheIndex) {
  SafeTensorsWriter one, two;
  one.add("x", "F32", {2, 2}, f32({1, 2, 3, 4}));
  one.add("stale", "F32", {1}, f32({9}));  // in the file but mapped to the other shard
  two.add("y", "F32", {3}, f32({5, 6, 7}));
  two.add("stale", "F32", {1}, f32({8}));
  write("model-00001-of-00002.safetensors", one);
  write("model-00002-of-00002.safetensors", two);
  ASSERT_TRUE(write_file_durably(dir_ / "model.safetensors.index.json",
                                 R"({"metadata": {}, "weight_map": {
    "x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors",
    "stale": "model-00002-of-00002.safetensors"}})")
                  .ok());
  auto folder = HfFolder::open(dir_);
  ASSERT_TRUE(folder.ok()) << folder.error().message;
  EXPECT_EQ(*folder->read("y", {{1, 3}}), (std::vector<float>{6, 7}));
  EXPECT_EQ(*folder->read("x", {{1, 2}, {0, 2}}), (std::vector<float>{3, 4}));
  EXPECT_EQ(*folder->read("stale", {{0, 1}}), (std::vector<float>{8}));
}

TEST(HalfFloats, Convert) {
  EXPECT_EQ(half_to_float(0x3C00), 1.0f);
  EXPECT_EQ(half_to_float(0xC000), -2.0f);
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(half_to_float(0x0001), 5.9604644775390625e-08f);  // the smallest subnormal
  EXPECT_EQ(half_to_float(0x7BFF), 65504.0f);
  EXPECT_TRUE(std::isinf(half_to_float(0x7C00)));
  EXPECT_EQ(bfloat16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bfloat16_to_float(0xC0A0), -5.0f);
}

TEST_F(HfFolderTest, F16Region) {
  SafeTensorsWriter w;
  const uint16_t halves[] = {0x3C00, 0x4000, 0x4200, 0x4400};  // 1 2 3 4
  w.add("h", "F16", {2, 2}, std::string_view(reinterpret_cast<const char*>(halves), 8));
  write("model.safetensors", w);
  auto folder = HfFolder::open(dir_);
  ASSERT_TRUE(folder.ok());
  EXPECT_EQ(*folder->read("h", {{0, 2}, {1, 2}}), (std::vector<float>{2, 4}));
}

TEST_F(HfFolderTest, ErrorsNameTheFileAndTensor) {
  EXPECT_NE(HfFolder::open(dir_).error().message.find("model.safetensors"), std::string::npos);
  SafeTensorsWriter w;
  w.add("a", "F32", {2, 3}, f32(grid(2, 3)));
  w.add("i", "I64", {1}, std::string(8, '\0'));
  write("model.safetensors", w);
  auto folder = HfFolder::open(dir_);
  ASSERT_TRUE(folder.ok());
  auto missing = folder->read("nope", {{0, 1}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("'nope'"), std::string::npos);
  EXPECT_NE(missing.error().message.find(dir_.string()), std::string::npos);
  auto outside = folder->read("a", {{0, 2}, {1, 4}});
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.error().message.find("'a'"), std::string::npos);
  EXPECT_NE(outside.error().message.find("model.safetensors"), std::string::npos);
  EXPECT_NE(outside.error().message.find("[2, 3]"), std::string::npos);
  auto dims = folder->read("a", {{0, 2}});
  ASSERT_FALSE(dims.ok());
  auto dtype = folder->read("i", {{0, 1}});
  ASSERT_FALSE(dtype.ok());
  EXPECT_NE(dtype.error().message.find("I64"), std::string::npos);

  // A truncated file fails when opened, naming it.
  const std::string bytes = w.finish();
  ASSERT_TRUE(
      write_file_durably(dir_ / "model.safetensors", bytes.substr(0, bytes.size() - 4)).ok());
  auto truncated = HfFolder::open(dir_);
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.error().message.find("model.safetensors"), std::string::npos);

  ASSERT_TRUE(write_file_durably(dir_ / "config.json", "{not json").ok());
  auto bad_json = HfFolder::open(dir_);
  ASSERT_FALSE(bad_json.ok());
  EXPECT_NE(bad_json.error().message.find("config.json"), std::string::npos);
}

TEST_F(HfFolderTest, IndexErrorsNameTheShard) {
  ASSERT_TRUE(write_file_durably(dir_ / "model.safetensors.index.json",
                                 R"({"weight_map": {"x": "missing.safetensors"}})")
                  .ok());
  auto missing = HfFolder::open(dir_);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("missing.safetensors"), std::string::npos);
  SafeTensorsWriter w;
  w.add("y", "F32", {1}, f32({1}));
  write("shard.safetensors", w);
  ASSERT_TRUE(write_file_durably(dir_ / "model.safetensors.index.json",
                                 R"({"weight_map": {"x": "shard.safetensors"}})")
                  .ok());
  auto absent = HfFolder::open(dir_);
  ASSERT_FALSE(absent.ok());
  EXPECT_NE(absent.error().message.find("'x'"), std::string::npos);
  EXPECT_NE(absent.error().message.find("shard.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace loom
