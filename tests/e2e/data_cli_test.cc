// `loom data inspect` and `loom train` on indexed datasets as a user meets them: the JSON line,
// validation rows in metrics.jsonl and the progress lines, and every bad dataset refused with
// exit code 2 naming its file, before anything is written.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/data/dataset_writer.h"

namespace {

namespace fs = std::filesystem;
using loom::data::testing::Documents;

struct Outcome {
  int code;
  std::string output;
};

Outcome run(const std::string& args) {
  FILE* pipe = popen((std::string(LOOM_BINARY_DIR) + "/bin/loom " + args + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  const int status = pclose(pipe);
  return Outcome{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

class DataCli : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) /
           ("loom_data_cli_" +
            std::string(testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  // 30 learnable documents (arithmetic sequences below GPT tiny's vocabulary) ending in id 0.
  std::string dataset(const std::string& name, int64_t top = 255) {
    Documents docs;
    for (int64_t k = 0; k < 30; ++k) {
      std::vector<int64_t> ids;
      for (int64_t t = 0; t < 20 + k; ++t) ids.push_back(1 + (k * 7 + (1 + k % 3) * t) % top);
      ids.push_back(0);
      docs.push_back({ids});
    }
    const std::string prefix = (dir_ / name).string();
    loom::data::testing::write_dataset(prefix, docs);
    return prefix;
  }
  std::string config(const std::string& data) {
    const fs::path p = dir_ / "c.yaml";
    std::ofstream(p) << "run: {steps: 4, output_dir: " << (dir_ / "run").string()
                     << "}\nmodel: {type: gpt, preset: tiny}\nbatch: {global: 8, micro: 4}\n"
                     << "data: {type: indexed, path: " << data
                     << "}\neval: {every: 2, steps: 2, split: 0.1}\n";
    return p.string();
  }
  void expect_rejected(const std::string& args, const std::string& expect) {
    Outcome r = run(args);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(expect), std::string::npos) << "missing '" << expect << "' in:\n"
                                                        << r.output;
    for (const char* crash : {"terminate called", "Segmentation", "internal error", "Aborted"})
      EXPECT_EQ(r.output.find(crash), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir_ / "run")) << "run directory written for a bad input";
  }
  fs::path dir_;
};

TEST_F(DataCli, InspectPrintsOneJsonLine) {
  const std::string prefix = dataset("d");
  Outcome r = run("data inspect " + prefix + " --doc 2");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto line = nlohmann::json::parse(r.output);
  EXPECT_EQ(line["documents"], 30);
  EXPECT_EQ(line["dtype"], "uint16");
  int64_t tokens = 0;
  for (int64_t k = 0; k < 30; ++k) tokens += 21 + k;
  EXPECT_EQ(line["tokens"], tokens);
  std::vector<int64_t> doc2;
  for (int64_t t = 0; t < 22; ++t) doc2.push_back(1 + (14 + 3 * t) % 255);
  doc2.push_back(0);
  EXPECT_EQ(line["doc"].get<std::vector<int64_t>>(), doc2);
  Outcome past = run("data inspect " + prefix + " --doc 30");
  EXPECT_EQ(past.code, 2);
  EXPECT_NE(past.output.find("has 30 documents"), std::string::npos) << past.output;
  // A data file cut short is found by checking the index against it.
  fs::resize_file(prefix + ".bin", fs::file_size(prefix + ".bin") - 10);
  Outcome cut = run("data inspect " + prefix);
  EXPECT_EQ(cut.code, 2) << cut.output;
  EXPECT_NE(cut.output.find(prefix + ".bin: "), std::string::npos) << cut.output;
  Outcome none = run("data inspect " + (dir_ / "nothing").string());
  EXPECT_EQ(none.code, 2);
  EXPECT_NE(none.output.find("nothing.idx: cannot open"), std::string::npos) << none.output;
}

TEST_F(DataCli, TrainValidatesIntoMetricsAndProgress) {
  Outcome r = run("train " + config(dataset("d")));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("step 2/4 val_loss "), std::string::npos) << r.output;
  std::ifstream in(dir_ / "run" / "metrics.jsonl");
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 4u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const bool validates = (i + 1) % 2 == 0;
    EXPECT_EQ(rows[i].contains("val_loss"), validates) << rows[i].dump();
    EXPECT_GE(rows[i]["data_time_s"].get<double>(), 0);
    if (!validates) continue;
    const double val = rows[i]["val_loss"];
    EXPECT_GT(val, 0);
    EXPECT_NEAR(rows[i]["val_ppl"].get<double>(), std::exp(val), 1e-9 * std::exp(val));
  }
}

TEST_F(DataCli, BadDatasetsAreRefusedBeforeAnythingIsWritten) {
  const std::string good = dataset("good");
  // Ids at or past the vocabulary (GPT tiny: 256).
  expect_rejected("train " + config(dataset("wide", 400)), "wide.bin: token id");
  // A truncated index, an unknown dtype code, a truncated data file.
  const std::string idx = loom::data::testing::read_file(good + ".idx");
  loom::data::testing::write_file(good + ".idx", idx.substr(0, idx.size() - 16));
  expect_rejected("train " + config(good), "good.idx: ");
  std::string code = idx;
  code[17] = 12;
  loom::data::testing::write_file(good + ".idx", code);
  expect_rejected("train " + config(good), "unknown dtype code 12");
  loom::data::testing::write_file(good + ".idx", idx);
  fs::resize_file(good + ".bin", fs::file_size(good + ".bin") - 2);
  expect_rejected("train " + config(good), "good.bin: ");
  // A sequence longer than the dataset.
  dataset("good");
  expect_rejected("train " + config(good) + " model.args.seq=2000", "one sample needs seq + 1");
  // The config's own mistakes name the key and its line.
  expect_rejected("train " + config(good) + " eval.split=0", "eval.every");
}

}  // namespace
