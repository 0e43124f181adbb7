// What a user watches while training, end to end through the `loom` binary: TensorBoard scalars
// equal to metrics.jsonl (read back by the tests' own event-file reader), measured step traces
// of a 4-rank tp2 x pp2 run against the plan's programs, and bad values of both keys refused
// with exit code 2 naming the key.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/config.h"
#include "launch/spawn.h"
#include "plan/plan.h"
#include "scheduler/render.h"
#include "tests/observe/event_reader.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kLoom = std::string(LOOM_BINARY_DIR) + "/bin/loom";

struct Outcome {
  int code;
  std::string output;
};

Outcome run(const std::string& args) {
  std::string cmd = kLoom + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  int status = pclose(pipe);
  return Outcome{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::path(testing::TempDir()) / ("loom_observe_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string write_config(const fs::path& dir) {
  const fs::path path = dir / "c.yaml";
  std::ofstream(path) << "run:\n  steps: 3\n  output_dir: " << (dir / "run").string()
                      << "\nmodel:\n  type: gpt\n  preset: tiny\nbatch:\n  global: 8\n  micro: 2\n"
                         "optimizer:\n  lr: 0.003\n";
  return path.string();
}

std::vector<json> metrics_rows(const fs::path& file) {
  std::ifstream in(file);
  std::vector<json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
  return rows;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(e.path());
  return out;
}

// Every scalar of every step in the event file is the value of the same key in the step's
// metrics.jsonl line (as float32, TensorBoard's type).
TEST(TensorBoard, TrainWritesTheMetricsAsScalars) {
  const fs::path dir = fresh_dir("tb");
  const fs::path tb = dir / "tb";
  Outcome r = run("train " + write_config(dir) + " logging.tensorboard=" + tb.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto rows = metrics_rows(dir / "run" / "metrics.jsonl");
  ASSERT_EQ(rows.size(), 3u);
  const auto files = event_files(tb);
  ASSERT_EQ(files.size(), 1u);
  const auto records = observe::event_reader::read_records(files[0].string());
  ASSERT_EQ(records.size(), 4u);  // the version, then one event per step
  EXPECT_EQ(observe::event_reader::decode_event(records[0]).file_version, "brain.Event:2");
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto event = observe::event_reader::decode_event(records[i + 1]);
    EXPECT_EQ(event.step, rows[i]["step"].get<int64_t>());
    std::map<std::string, float> scalars(event.scalars.begin(), event.scalars.end());
    for (const char* key : {"world_size", "loss", "lr", "grad_norm", "step_time_s", "data_time_s",
                            "tokens_per_s", "peak_mem_bytes"}) {
      ASSERT_TRUE(scalars.count(key)) << "step " << i + 1 << " has no " << key;
      EXPECT_EQ(scalars[key], static_cast<float>(rows[i][key].get<double>()))
          << "step " << i + 1 << " " << key;
    }
    EXPECT_EQ(scalars.size(), 8u);
  }
}

void expect_rejected(const std::string& args, const std::string& expect, const fs::path& dir) {
  Outcome r = run(args);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(expect), std::string::npos) << "missing '" << expect << "' in:\n"
                                                      << r.output;
  EXPECT_FALSE(fs::exists(dir / "run")) << "run directory written for a bad input";
}

TEST(ObserveErrors, BadValuesNameTheKey) {
  const fs::path dir = fresh_dir("errors");
  const std::string config = write_config(dir);
  std::ofstream(dir / "a_file") << "x";
  expect_rejected("train " + config + " logging.tensorboard=" + (dir / "a_file" / "tb").string(),
                  "logging.tensorboard: cannot create '" + (dir / "a_file" / "tb").string() + "'",
                  dir);
  expect_rejected("train " + config + " logging.trace_steps=[-1]",
                  "logging.trace_steps: each step must be positive", dir);
  expect_rejected("train " + config + " logging.trace_steps=[two]",
                  "logging.trace_steps: expected a list of integers", dir);
  expect_rejected("train " + config + " logging.trace_steps=[1.5]",
                  "logging.trace_steps: expected a list of integers", dir);
  expect_rejected("train " + config + " \"logging.trace_steps=[2, 7]\"",
                  "logging.trace_steps: step 7 is beyond the run (run.steps 3)", dir);
}

// The program blocks of `rank`, named as the trace names them, in program order.
std::vector<std::string> program_blocks(const plan::Plan& p, int64_t rank) {
  std::vector<std::string> out;
  for (const auto& b : p.file.lowered.programs[static_cast<size_t>(rank)].blocks)
    out.push_back(sched::block_slice_name(sched::to_char(b.kind), b.stage, b.micro_batch));
  return out;
}

struct Slice {
  std::string name;
  int64_t pid = 0, tid = 0;
  double ts = 0, dur = 0;
  json args;
};

std::vector<Slice> slices_of(const json& doc) {
  std::vector<Slice> out;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "X")
      out.push_back({e["name"], e["pid"], e["tid"], e["ts"].get<double>(), e["dur"].get<double>(),
                     e.value("args", json::object())});
  return out;
}

// One process: the trace of step 2 holds its program's blocks (4 micro-batches of 2, F then B
// each) and no other step is traced.
TEST(StepTrace, OneProcessTracesTheStepAsked) {
  const fs::path dir = fresh_dir("one");
  Outcome r = run("train " + write_config(dir) + " logging.trace_steps=[2]");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("loom: trace step 2 ("), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "run" / "trace_step_1.json"));
  EXPECT_FALSE(fs::exists(dir / "run" / "trace_step_3.json"));
  std::ifstream in(dir / "run" / "trace_step_2.json");
  const json doc = json::parse(in);
  std::vector<std::string> blocks;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "X" && e["tid"] == 0) blocks.push_back(e["name"]);
  EXPECT_EQ(blocks, (std::vector<std::string>{"F s0 mb0", "B s0 mb0", "F s0 mb1", "B s0 mb1",
                                              "F s0 mb2", "B s0 mb2", "F s0 mb3", "B s0 mb3"}));
  EXPECT_EQ(doc["otherData"]["step"], 2);
}

// 4 ranks, tp2 x pp2, step 3 traced: every block of every rank's program exactly once, in the
// program's order; every send has its receive on the peer (same tag and bytes), which ends
// after the send started; the summary line on rank 0 against the plan's estimate.
TEST(StepTrace, Tp2Pp2TraceHasEveryBlockAndPairedMessages) {
  const fs::path dir = fresh_dir("tp2pp2");
  const std::string config = write_config(dir);
  const std::vector<std::string> plan_keys = {"parallel.tp=2", "parallel.pp=2"};
  std::vector<std::string> args = {"train", config, "comm.backend=gloo", "comm.timeout_s=60",
                                   "logging.trace_steps=[3]"};
  args.insert(args.end(), plan_keys.begin(), plan_keys.end());
  auto results = launch::spawn_workers(kLoom, 4, args, 150, {{"OMP_NUM_THREADS", "1"}});
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << launch::describe(results);
  const fs::path trace_file = dir / "run" / "trace_step_3.json";
  EXPECT_NE(results[0].output.find("trace step 3 (" + trace_file.string() + "): makespan"),
            std::string::npos)
      << results[0].output;
  EXPECT_NE(results[0].output.find("(plan "), std::string::npos) << results[0].output;
  EXPECT_FALSE(fs::exists(dir / "run" / "trace_step_1.json"));
  EXPECT_FALSE(fs::exists(dir / "run" / "trace_step_2.json"));
  ASSERT_TRUE(fs::exists(trace_file));
  std::ifstream in(trace_file);
  const json doc = json::parse(in);

  auto loaded = load_config(config, plan_keys);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  auto made = plan::make_plan(*loaded);
  ASSERT_TRUE(made.ok()) << made.error().message;

  const std::vector<Slice> slices = slices_of(doc);
  std::map<int64_t, std::vector<Slice>> compute, comm;
  for (const Slice& s : slices) (s.tid == 0 ? compute : comm)[s.pid].push_back(s);
  std::map<int64_t, std::string> process;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "process_name") process[e["pid"]] = e["args"]["name"];
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(process[r], "rank " + std::to_string(r));
    auto blocks = compute[r];
    std::stable_sort(blocks.begin(), blocks.end(),
                     [](const Slice& a, const Slice& b) { return a.ts < b.ts; });
    std::vector<std::string> names;
    for (const Slice& s : blocks) names.push_back(s.name);
    EXPECT_EQ(names, program_blocks(*made, r)) << "rank " << r;
    for (size_t i = 1; i < blocks.size(); ++i)
      EXPECT_GE(blocks[i].ts, blocks[i - 1].ts + blocks[i - 1].dur)
          << "rank " << r << " block " << i;
    EXPECT_FALSE(comm[r].empty()) << "rank " << r << " recorded no communication";
  }

  // Sends and receives pair up: (sender, receiver, tag, bytes), one for one.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::vector<const Slice*>> sends, recvs;
  for (const auto& [rank, events] : comm)
    for (const Slice& s : events) {
      if (s.name == "send")
        sends[{rank, s.args["peer"], s.args["tag"], s.args["bytes"]}].push_back(&s);
      else if (s.name == "recv")
        recvs[{s.args["peer"], rank, s.args["tag"], s.args["bytes"]}].push_back(&s);
    }
  EXPECT_FALSE(sends.empty());
  size_t pairs = 0;
  for (const auto& [key, sent] : sends) {
    auto it = recvs.find(key);
    ASSERT_NE(it, recvs.end()) << "a send from rank " << std::get<0>(key) << " to rank "
                               << std::get<1>(key) << " (tag " << std::get<2>(key)
                               << ") has no receive";
    ASSERT_EQ(it->second.size(), sent.size());
    for (size_t i = 0; i < sent.size(); ++i) {
      EXPECT_GE(it->second[i]->ts + it->second[i]->dur, sent[i]->ts)
          << "a receive ended before its send started (tag " << std::get<2>(key) << ")";
      EXPECT_GT(std::get<3>(key), 0);
      ++pairs;
    }
  }
  size_t received = 0;
  for (const auto& [key, r] : recvs) received += r.size();
  EXPECT_EQ(received, pairs) << "receives without a send";

  // Each collective appears on every member of its group ("[0,1]"), as often on each.
  std::map<std::pair<std::string, std::string>, std::map<int64_t, int>> collectives;
  for (const auto& [rank, events] : comm)
    for (const Slice& s : events)
      if (s.args.contains("group")) ++collectives[{s.name, s.args["group"]}][rank];
  EXPECT_FALSE(collectives.empty());
  for (const auto& [what, per_rank] : collectives) {
    const json members = json::parse(what.second);
    ASSERT_EQ(per_rank.size(), members.size()) << what.first << " on " << what.second;
    for (const auto& m : members)
      EXPECT_EQ(per_rank.at(m.get<int64_t>()), per_rank.begin()->second)
          << what.first << " on " << what.second;
  }
  EXPECT_GT(doc["otherData"]["makespan_s"].get<double>(), 0);
  EXPECT_EQ(doc["otherData"]["comm_s"].size(), 4u);
}

}  // namespace
}  // namespace loom
