#include "core/config.h"

#include <gtest/gtest.h>

#include <fstream>

namespace loom {
namespace {

const char* kGood = R"(run:
  name: t
  steps: 5
model:
  type: gpt
  preset: tiny
  args:
    layers: 3
parallel:
  tp: 2
batch:
  global: 16
  micro: 4
optimizer:
  lr: 0.01
)";

Config must_parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  auto c = parse_config(text, "t.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return c.ok() ? *c : Config{};
}

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  auto c = parse_config(text, "t.yaml", overrides);
  EXPECT_FALSE(c.ok()) << "accepted:\n" << text;
  return c.ok() ? std::string() : c.error().message;
}

TEST(Config, ReadsValuesAndDefaults) {
  Config c = must_parse(kGood);
  EXPECT_EQ(c.run.name, "t");
  EXPECT_EQ(c.run.steps, 5);
  EXPECT_EQ(c.parallel.tp, 2);
  EXPECT_EQ(c.parallel.dp, 1);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.01);
  EXPECT_EQ(c.model.args.at("layers"), "3");
  EXPECT_EQ(c.micro_batches(), 4);
  EXPECT_EQ(c.where("parallel.tp"), "t.yaml:10");
  EXPECT_EQ(c.where("parallel.dp"), "default");
  EXPECT_EQ(c.where("model.args.layers"), "t.yaml:8");
}

TEST(Config, EmptyFileIsAllDefaults) {
  Config c = must_parse("");
  EXPECT_EQ(c.optimizer.type, "adamw");
}

TEST(Config, OverridesWin) {
  Config c = must_parse(kGood, {"parallel.tp=4", "run.steps=7", "model.args.hidden=32",
                                "optimizer.betas=[0.8, 0.9]"});
  EXPECT_EQ(c.parallel.tp, 4);
  EXPECT_EQ(c.run.steps, 7);
  EXPECT_EQ(c.model.args.at("hidden"), "32");
  EXPECT_DOUBLE_EQ(c.optimizer.betas[0], 0.8);
  EXPECT_EQ(c.where("parallel.tp"), "command line (parallel.tp=4)");
}

TEST(Config, ResolvedYamlRoundTrips) {
  Config c = must_parse(kGood, {"parallel.stages=[[0,1],[2,2]]"});
  Config back = must_parse(to_yaml(c));
  EXPECT_EQ(to_yaml(back), to_yaml(c));
  EXPECT_EQ(back.parallel.stages.size(), 2u);
  EXPECT_EQ(back.model.args.at("layers"), "3");
}

// logging.tensorboard and logging.trace_steps: off by default, read from the file and from
// overrides, and through the resolved YAML.
TEST(Config, ObservabilityKeys) {
  Config off = must_parse(kGood);
  EXPECT_TRUE(off.logging.tensorboard.empty());
  EXPECT_TRUE(off.logging.trace_steps.empty());
  Config c =
      must_parse(std::string(kGood) + "logging:\n  tensorboard: tb\n  trace_steps: [3, 10]\n");
  EXPECT_EQ(c.logging.tensorboard, "tb");
  EXPECT_EQ(c.logging.trace_steps, (std::vector<int64_t>{3, 10}));
  Config o = must_parse(kGood, {"logging.trace_steps=[2]", "logging.tensorboard=/tmp/x"});
  EXPECT_EQ(o.logging.trace_steps, (std::vector<int64_t>{2}));
  EXPECT_EQ(o.logging.tensorboard, "/tmp/x");
  Config back = must_parse(to_yaml(c));
  EXPECT_EQ(back.logging.trace_steps, c.logging.trace_steps);
  EXPECT_EQ(back.logging.tensorboard, "tb");
}

TEST(ConfigErrors, TraceStepsAreStepNumbers) {
  std::string e = error_of(kGood, {"logging.trace_steps=[0]"});
  EXPECT_NE(e.find("logging.trace_steps: each step must be positive (steps count from 1), got 0"),
            std::string::npos)
      << e;
  e = error_of(kGood, {"logging.trace_steps=[-2]"});
  EXPECT_NE(e.find("logging.trace_steps: each step must be positive"), std::string::npos) << e;
  e = error_of("logging:\n  trace_steps: [2.5]\n");
  EXPECT_NE(e.find("t.yaml:2: logging.trace_steps: expected a list of integers"), std::string::npos)
      << e;
  e = error_of("logging:\n  trace_steps: [three]\n");
  EXPECT_NE(e.find("logging.trace_steps: expected a list of integers"), std::string::npos) << e;
  e = error_of("logging:\n  trace_steps: 3\n");
  EXPECT_NE(e.find("logging.trace_steps: expected a list of integers, e.g. [3, 10], got '3'"),
            std::string::npos)
      << e;
}

// A config file with no sections is refused naming the file; a file with `{}` asks for defaults.
TEST(ConfigErrors, EmptyFileIsRefused) {
  const std::string path = ::testing::TempDir() + "/loom_empty_config.yaml";
  for (const char* text : {"", "# only a comment\n", "~\n"}) {
    std::ofstream(path) << text;
    auto c = load_config(path);
    ASSERT_FALSE(c.ok()) << "an empty config was accepted: '" << text << "'";
    EXPECT_NE(c.error().message.find(path + ": the config is empty"), std::string::npos)
        << c.error().message;
  }
  std::ofstream(path) << "{}\n";
  EXPECT_TRUE(load_config(path).ok());
}

TEST(ConfigErrors, MalformedYamlNamesTheLine) {
  std::string e = error_of("run:\n  name: [unclosed\n  steps: 3\n");
  EXPECT_NE(e.find("t.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("malformed YAML"), std::string::npos) << e;
}

TEST(ConfigErrors, UnknownKeySuggestsClosest) {
  std::string e = error_of("batch:\n  mciro: 4\n");
  EXPECT_NE(e.find("t.yaml:2"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'batch.mciro'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'batch.micro'"), std::string::npos) << e;
}

TEST(ConfigErrors, UnknownSectionSuggestsClosest) {
  std::string e = error_of("paralel:\n  tp: 2\n");
  EXPECT_NE(e.find("did you mean 'parallel'"), std::string::npos) << e;
}

TEST(ConfigErrors, UnknownOverrideKey) {
  std::string e = error_of(kGood, {"parallel.tpp=2"});
  EXPECT_NE(e.find("did you mean 'parallel.tp'"), std::string::npos) << e;
  EXPECT_NE(error_of(kGood, {"novalue"}).find("key=value"), std::string::npos);
}

TEST(ConfigErrors, WrongType) {
  std::string e = error_of("run:\n  steps: many\n");
  EXPECT_NE(e.find("t.yaml:2: run.steps: expected an integer, got 'many'"), std::string::npos) << e;
  e = error_of("parallel:\n  sp: maybe\n");
  EXPECT_NE(e.find("parallel.sp: expected true or false"), std::string::npos) << e;
  e = error_of("optimizer:\n  betas: 0.9\n");
  EXPECT_NE(e.find("optimizer.betas: expected a list of numbers"), std::string::npos) << e;
}

TEST(ConfigErrors, NegativeOrZeroSizes) {
  std::string e = error_of("parallel:\n  tp: -1\n");
  EXPECT_NE(e.find("t.yaml:2: parallel.tp: must be positive, got -1"), std::string::npos) << e;
  e = error_of("batch:\n  micro: 0\n");
  EXPECT_NE(e.find("batch.micro: must be positive, got 0"), std::string::npos) << e;
  e = error_of(kGood, {"run.steps=0"});
  EXPECT_NE(e.find("command line (run.steps=0): run.steps: must be positive"), std::string::npos)
      << e;
  e = error_of("optimizer:\n  lr: -0.1\n");
  EXPECT_NE(e.find("optimizer.lr: must be positive"), std::string::npos) << e;
}

TEST(ConfigErrors, ChoicesSuggestClosest) {
  std::string e = error_of("optimizer:\n  type: adamww\n");
  EXPECT_NE(e.find("did you mean 'adamw'"), std::string::npos) << e;
}

TEST(ConfigErrors, BatchDivisibility) {
  std::string e = error_of("batch:\n  global: 10\n  micro: 4\n");
  EXPECT_NE(e.find("batch.global (10) must be divisible by batch.micro (4) x parallel.dp (1)"),
            std::string::npos)
      << e;
}

TEST(ConfigErrors, TokensNeedAPath) {
  std::string e = error_of("data:\n  type: tokens\n");
  EXPECT_NE(e.find("data.path"), std::string::npos) << e;
}

TEST(ConfigErrors, CsvScheduleAndItsFileGoTogether) {
  std::string none = error_of("parallel:\n  pp: 2\n  schedule: csv\n");
  EXPECT_NE(none.find("parallel.schedule_csv: parallel.schedule is 'csv' but no "
                      "parallel.schedule_csv file is given"),
            std::string::npos)
      << none;
  std::string other = error_of("parallel:\n  pp: 2\n  schedule_csv: s.csv\n");
  EXPECT_NE(other.find("t.yaml:3: parallel.schedule_csv: a schedule file is given but "
                       "parallel.schedule is '1f1b'"),
            std::string::npos)
      << other;
  Config c = must_parse("parallel:\n  pp: 2\n  schedule: csv\n  schedule_csv: s.csv\n");
  EXPECT_EQ(c.parallel.schedule_csv, "s.csv");
}

// An empty value (`key:`, `~`, `null`, or `key=` on the command line) is never the built-in
// default in disguise: a number, flag or list refuses it naming the key and where it was given;
// a text key takes the empty string, which its own check then judges.
TEST(ConfigErrors, EmptyValueIsNotTheDefault) {
  for (const char* empty : {"", "null", "~"}) {
    const std::string override = std::string("run.steps=") + empty;
    std::string e = error_of(kGood, {override});
    EXPECT_NE(e.find("command line (" + override +
                     "): run.steps: expected an integer, got an empty value"),
              std::string::npos)
        << e;
  }
  std::string e = error_of("run:\n  name: t\n  steps:\n  seed: 3\n");
  EXPECT_NE(e.find("t.yaml:3: run.steps: expected an integer, got an empty value"),
            std::string::npos)
      << e;
  e = error_of("parallel:\n  tp: 2\n  sp: ~\n");
  EXPECT_NE(e.find("t.yaml:3: parallel.sp: expected true or false, got an empty value"),
            std::string::npos)
      << e;
  e = error_of(kGood, {"optimizer.betas="});
  EXPECT_NE(e.find("optimizer.betas: expected a list of numbers, got an empty value"),
            std::string::npos)
      << e;
  e = error_of(kGood, {"run.name="});
  EXPECT_NE(e.find("command line (run.name=): run.name: must not be empty"), std::string::npos)
      << e;
  e = error_of(kGood, {"model.preset=null"});
  EXPECT_NE(e.find("model.preset: must not be empty"), std::string::npos) << e;
  e = error_of("model:\n  args:\n    layers:\n    hidden: 8\n");
  EXPECT_NE(e.find("t.yaml:3: model.args.layers: expected a single value, got an empty value"),
            std::string::npos)
      << e;
  // A text key whose empty value means something (here: no TensorBoard) is cleared.
  Config c =
      must_parse(std::string(kGood) + "logging:\n  tensorboard: tb\n", {"logging.tensorboard="});
  EXPECT_EQ(c.logging.tensorboard, "");
  EXPECT_EQ(c.where("logging.tensorboard"), "command line (logging.tensorboard=)");
}

// yaml-cpp keeps the first of two equal keys and drops the second: refused, naming both lines.
TEST(ConfigErrors, RepeatedKeyNamesBothLines) {
  std::string e = error_of("run:\n  steps: 3\n  name: t\n  steps: 4\n");
  EXPECT_NE(e.find("t.yaml:4: run.steps: given twice, on lines 2 and 4"), std::string::npos) << e;
  e = error_of("run:\n  steps: 3\nbatch:\n  micro: 4\nrun:\n  name: t\n");
  EXPECT_NE(e.find("t.yaml:5: run: given twice, on lines 1 and 5"), std::string::npos) << e;
  e = error_of("model:\n  args:\n    layers: 2\n    layers: 3\n");
  EXPECT_NE(e.find("t.yaml:4: model.args.layers: given twice, on lines 3 and 4"), std::string::npos)
      << e;
  // The same name in two sections is two keys.
  Config c = must_parse("optimizer:\n  schedule: cosine\nparallel:\n  schedule: gpipe\n");
  EXPECT_EQ(c.optimizer.schedule, "cosine");
  EXPECT_EQ(c.parallel.schedule, "gpipe");
}

// A plain load reads the first YAML document only: a second one is refused naming its line.
TEST(ConfigErrors, SecondDocumentIsRefused) {
  std::string e = error_of("run:\n  steps: 3\n---\nrun:\n  steps: 4\n");
  EXPECT_NE(e.find("t.yaml:4: a second YAML document"), std::string::npos) << e;
  const std::string path = ::testing::TempDir() + "/loom_two_documents.yaml";
  std::ofstream(path) << "---\n---\nrun:\n  steps: 4\n";
  auto loaded = load_config(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.error().message.find(path + ":3: a second YAML document"), std::string::npos)
      << loaded.error().message;
  // Document markers around one document, and an empty document after it, lose nothing.
  EXPECT_EQ(must_parse("---\nrun:\n  steps: 3\n...\n").run.steps, 3);
  EXPECT_EQ(must_parse("run:\n  steps: 3\n---\n# nothing more\n").run.steps, 3);
}

// Text yaml-cpp's parser cannot get past (a `,` at block level) would leave the first document
// empty and every value after it unread: refused naming the line.
TEST(ConfigErrors, UnreadableTextIsMalformed) {
  std::string e = error_of("# a comment\n  , 4 sequences\nrun:\n  steps: 3\n");
  EXPECT_NE(e.find("t.yaml:2: malformed YAML"), std::string::npos) << e;
}

// Sequence parallelism splits over the tensor-parallel ranks; with parallel.tp 1 there are none.
TEST(ConfigErrors, SequenceParallelismNeedsTensorParallelism) {
  std::string e = error_of("parallel:\n  sp: true\n");
  EXPECT_NE(e.find("t.yaml:2: parallel.sp: sequence parallelism needs parallel.tp > 1; "
                   "parallel.tp is 1 (default)"),
            std::string::npos)
      << e;
  e = error_of(kGood, {"parallel.sp=true", "parallel.tp=1"});
  EXPECT_NE(e.find("command line (parallel.sp=true): parallel.sp: sequence parallelism needs "
                   "parallel.tp > 1; parallel.tp is 1 (command line (parallel.tp=1))"),
            std::string::npos)
      << e;
  EXPECT_TRUE(must_parse(kGood, {"parallel.sp=true"}).parallel.sp);  // tp 2
}

// A token file with synthetic data would be read by nothing.
TEST(ConfigErrors, SyntheticDataReadsNoPath) {
  std::string e = error_of("data:\n  path: train.bin\n");
  EXPECT_NE(e.find("t.yaml:2: data.path: a data file is given but data.type is 'synthetic'"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("set data.type: tokens"), std::string::npos) << e;
  Config c = must_parse("data:\n  type: tokens\n  path: train.bin\n");
  EXPECT_EQ(c.data.path, "train.bin");
}

// data.blend and eval.* survive the resolved YAML `loom config` prints and a run directory keeps.
TEST(Config, DataBlendAndEvalRoundTrip) {
  Config c = must_parse(
      "data:\n  type: indexed\n  blend: [[0.7, data/web], [0.3, data/code]]\n  seed: 9\n"
      "eval: {every: 50, steps: 4, split: 0.01}\n");
  ASSERT_EQ(c.data.blend.size(), 2u);
  EXPECT_EQ(c.data.blend[1].path, "data/code");
  EXPECT_EQ(c.data_seed(), 9u);
  auto again = parse_config(to_yaml(c), "resolved.yaml");
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->data.blend, c.data.blend);
  EXPECT_EQ(again->eval.every, 50);
  EXPECT_EQ(again->eval.split, 0.01);
  EXPECT_EQ(must_parse("").data_seed(), 1234u);  // run.seed by default
}

TEST(ModelArgs, TypedAccessNamesTheLine) {
  Config c = must_parse(kGood, {"model.args.tied=yes", "model.args.heads=four"});
  ModelArgs args(c);
  EXPECT_EQ(*args.get_int("layers", 2), 3);
  EXPECT_EQ(*args.get_int("hidden", 64), 64);
  EXPECT_TRUE(*args.get_bool("tied", false));
  auto bad = args.get_int("heads", 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("model.args.heads: expected an integer, got 'four'"),
            std::string::npos);
  Status unknown = args.check_known({"layers", "hidden", "tied", "head"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("did you mean 'model.args.head'"), std::string::npos);
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// model.args.moe is a nested mapping, read as "moe.<key>" with each key's line; overrides reach
// its keys; the resolved YAML reads back the same.
TEST(Config, NestedMoeArgs) {
  const std::string text = R"(model:
  type: llama
  args:
    moe:
      experts: 8
      top_k: 2
parallel: {dp: 4, ep: 2}
batch: {global: 8, micro: 2}
)";
  Config c = must_parse(text, {"model.args.moe.top_k=1", "model.args.moe.score=sigmoid"});
  EXPECT_EQ(c.model.args.at("moe.experts"), "8");
  EXPECT_EQ(c.model.args.at("moe.top_k"), "1");
  EXPECT_EQ(c.model.args.at("moe.score"), "sigmoid");
  EXPECT_EQ(c.where("model.args.moe.experts"), "t.yaml:5");
  EXPECT_EQ(c.where("model.args.moe.top_k"), "command line (model.args.moe.top_k=1)");
  EXPECT_EQ(c.parallel.ep, 2);
  Config back = must_parse(to_yaml(c));
  EXPECT_EQ(back.model.args, c.model.args);
  // Lists and deeper nesting are refused, naming the key.
  const std::string deep = error_of("model:\n  args:\n    moe:\n      experts: [1, 2]\n");
  EXPECT_NE(deep.find("model.args.moe.experts"), std::string::npos) << deep;
}

// parallel.ep is carved out of the data-parallel ranks: it must divide parallel.dp.
TEST(Config, ExpertParallelismDividesDataParallelism) {
  const std::string e = error_of("parallel: {dp: 4, ep: 3}\nbatch: {global: 8, micro: 2}\n");
  EXPECT_NE(e.find("parallel.ep"), std::string::npos) << e;
  EXPECT_NE(e.find("divide parallel.dp (4)"), std::string::npos) << e;
  EXPECT_NE(error_of("parallel: {ep: 0}\n").find("parallel.ep"), std::string::npos);
}

}  // namespace
}  // namespace loom
