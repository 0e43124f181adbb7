// TensorBoard event files read back by the tests' own reader (event_reader.h).
#include "observe/event_file.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "observe/crc32c.h"
#include "tests/observe/event_reader.h"

namespace loom::observe {
namespace {

namespace fs = std::filesystem;
using namespace loom::observe::event_reader;

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::path(testing::TempDir()) / ("loom_tb_" + name);
  fs::remove_all(d);
  return d;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(e.path());
  return out;
}

TEST(Tfrecord, FramesDataWithLengthAndMaskedCrcs) {
  const std::string r = tfrecord("abc");
  ASSERT_EQ(r.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(read_le(r, 0, 8), 3u);
  EXPECT_EQ(read_le(r, 8, 4), mask(crc32c(std::string("\x03\0\0\0\0\0\0\0", 8))));
  EXPECT_EQ(r.substr(12, 3), "abc");
  EXPECT_EQ(read_le(r, 15, 4), mask(crc32c("abc")));
}

// Every scalar of every step comes back with its tag, its value as float32, its step and wall
// time; zeros and negative values too (a oneof field is written even when 0).
TEST(EventFile, EveryScalarOfEveryStepReadsBack) {
  const fs::path dir = fresh_dir("scalars") / "nested";
  auto writer = EventFileWriter::open(dir.string());
  ASSERT_TRUE(writer.ok()) << writer.error().message;
  const std::vector<std::string> tags = {"loss",         "lr",          "grad_norm",
                                         "tokens_per_s", "step_time_s", "peak_mem_bytes"};
  auto value = [](int step, size_t tag) {
    if (tag == 1 && step == 1) return 0.0;  // a warm-up's zero learning rate
    return (step * 7.25 + static_cast<double>(tag) * 1e-3) * (tag == 2 ? -1 : 1) +
           (tag == 5 ? 123456789.0 : 0.0);
  };
  for (int step = 1; step <= 5; ++step) {
    std::vector<std::pair<std::string, double>> scalars;
    for (size_t t = 0; t < tags.size(); ++t) scalars.emplace_back(tags[t], value(step, t));
    ASSERT_TRUE((*writer)->write_scalars(step, scalars, 1700000000.5 + step).ok());
  }
  ASSERT_EQ(event_files(dir).size(), 1u);
  const std::string path = (*writer)->path();
  EXPECT_EQ(event_files(dir)[0].string(), path);
  writer->reset();  // closing hands the file's last events over
  const std::vector<std::string> records = read_records(path);
  ASSERT_EQ(records.size(), 6u);
  const Event version = decode_event(records[0]);
  EXPECT_EQ(version.file_version, "brain.Event:2");
  EXPECT_GT(version.wall_time, 1.6e9);
  for (int step = 1; step <= 5; ++step) {
    const Event e = decode_event(records[static_cast<size_t>(step)]);
    EXPECT_EQ(e.step, step);
    EXPECT_DOUBLE_EQ(e.wall_time, 1700000000.5 + step);
    ASSERT_EQ(e.scalars.size(), tags.size()) << "step " << step;
    for (size_t t = 0; t < tags.size(); ++t) {
      EXPECT_EQ(e.scalars[t].first, tags[t]);
      EXPECT_EQ(e.scalars[t].second, static_cast<float>(value(step, t)))
          << "step " << step << " " << tags[t];
    }
  }
}

// With no flush interval each step is in the file when write_scalars returns.
TEST(EventFile, EachStepIsOnDiskAtOnceWithoutAnInterval) {
  const fs::path dir = fresh_dir("flush");
  auto writer = EventFileWriter::open(dir.string(), 0);
  ASSERT_TRUE(writer.ok()) << writer.error().message;
  EXPECT_EQ(read_records((*writer)->path()).size(), 1u);
  ASSERT_TRUE((*writer)->write_scalars(1, {{"loss", 2.5}}, 1.0).ok());
  const auto records = read_records((*writer)->path());
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(decode_event(records[1]).scalars.at(0).second, 2.5f);
}

// Within the interval steps wait in the writer's buffer; the first write after it hands them all
// over, as flush() and closing do.
TEST(EventFile, StepsReachTheFileOncePerIntervalAndOnClose) {
  const fs::path dir = fresh_dir("interval");
  auto writer = EventFileWriter::open(dir.string(), 1.0);
  ASSERT_TRUE(writer.ok()) << writer.error().message;
  const std::string path = (*writer)->path();
  EXPECT_EQ(read_records(path).size(), 1u);  // the file version, at once
  ASSERT_TRUE((*writer)->write_scalars(1, {{"loss", 2.5}}, 1.0).ok());
  ASSERT_TRUE((*writer)->write_scalars(2, {{"loss", 2.25}}, 2.0).ok());
  EXPECT_EQ(read_records(path).size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ASSERT_TRUE((*writer)->write_scalars(3, {{"loss", 2.0}}, 3.0).ok());
  EXPECT_EQ(read_records(path).size(), 4u);
  ASSERT_TRUE((*writer)->write_scalars(4, {{"loss", 1.75}}, 4.0).ok());
  EXPECT_EQ(read_records(path).size(), 4u);
  ASSERT_TRUE((*writer)->flush().ok());
  EXPECT_EQ(read_records(path).size(), 5u);
  ASSERT_TRUE((*writer)->write_scalars(5, {{"loss", 1.5}}, 5.0).ok());
  writer->reset();
  const auto records = read_records(path);
  ASSERT_EQ(records.size(), 6u);
  EXPECT_EQ(decode_event(records[5]).step, 5);
}

TEST(EventFile, ADirectoryThatCannotBeCreatedIsAnError) {
  const fs::path dir = fresh_dir("blocked");
  fs::create_directories(dir);
  std::ofstream(dir / "file") << "x";
  auto writer = EventFileWriter::open((dir / "file" / "tb").string());
  ASSERT_FALSE(writer.ok());
  EXPECT_NE(writer.error().message.find("cannot create '" + (dir / "file" / "tb").string() + "'"),
            std::string::npos)
      << writer.error().message;
}

}  // namespace
}  // namespace loom::observe
