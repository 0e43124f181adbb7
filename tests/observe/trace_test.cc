#include "observe/trace.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

namespace loom::observe {
namespace {

TraceEvent block(const std::string& name, int64_t start, int64_t end) {
  TraceEvent e;
  e.name = name;
  e.kind = name.substr(0, 1);
  e.stage = name[3] - '0';
  e.micro_batch = name[7] - '0';
  e.start_us = start;
  e.end_us = end;
  return e;
}

TraceEvent comm(const std::string& name, int64_t start, int64_t end, int64_t peer, int64_t tag,
                int64_t bytes) {
  TraceEvent e = comm_event(name, peer, tag, bytes, "");
  e.start_us = start;
  e.end_us = end;
  return e;
}

TEST(Tracer, OffCostsNothingAndMakesNoEvent) {
  bool made = false;
  {
    TraceSpan span(nullptr, [&] {
      made = true;
      return TraceEvent{};
    });
  }
  EXPECT_FALSE(made);
}

TEST(Tracer, ASpanRecordsItsStartAndEnd) {
  Tracer t;
  int synced = 0;
  t.set_sync([&] { ++synced; });
  const int64_t before = t.now_us();
  {
    TraceSpan span(&t, [] { return comm_event("recv", 1, 7, 64, ""); });
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(t.events().size(), 1u);
  const TraceEvent& e = t.events()[0];
  EXPECT_EQ(e.name, "recv");
  EXPECT_EQ(e.track, Track::kComm);
  EXPECT_EQ(e.peer, 1);
  EXPECT_EQ(e.tag, 7);
  EXPECT_EQ(e.bytes, 64);
  EXPECT_GE(e.start_us, before);
  EXPECT_GE(e.end_us - e.start_us, 5000);
  EXPECT_EQ(synced, 2);  // before each time read
}

// The clock is the system clock's microseconds, so two ranks' Tracers agree.
TEST(Tracer, ClockIsCommonToTracers) {
  Tracer a;
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  Tracer b;
  const int64_t ta = a.now_us(), tb = b.now_us();
  EXPECT_LT(std::abs(ta - tb), 1000);
  const int64_t wall = std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  EXPECT_LT(std::abs(wall - tb), 100000);
}

TEST(TraceEvents, RoundTripThroughBytes) {
  std::vector<TraceEvent> events = {block("F s1 mb0", 10, 20),
                                    comm("send", 20, 21, 3, 1000005, 4096)};
  events[1].group = "[0,1]";
  auto back = parse_events(serialize(events));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, events);
  EXPECT_FALSE(parse_events("not json").ok());
  EXPECT_FALSE(parse_events("[{\"name\": 1}]").ok());
}

// Two ranks of a pipeline, closed form: makespan 100 us (first start 0, last end 100). Rank 0
// computes 60 (its send starts after its block). Rank 1 is in blocks for 50, of which 22 it
// waits in a receive and 2 in an all-reduce that runs past the block's end: it computes 26.
// Bubble (40 + 74) / 200.
std::vector<std::vector<TraceEvent>> two_ranks() {
  return {{block("F s0 mb0", 0, 30), comm("send", 30, 31, 1, 5, 16), block("B s0 mb0", 70, 100)},
          {comm("recv", 10, 32, 0, 5, 16), block("F s1 mb0", 10, 40), block("B s1 mb0", 40, 60),
           comm("all_reduce", 58, 64, -1, -1, 8)}};
}

TEST(TraceSummary, BubbleAndCommunicationInClosedForm) {
  const TraceSummary s = summarize(two_ranks());
  EXPECT_DOUBLE_EQ(s.makespan_s, 100e-6);
  ASSERT_EQ(s.busy_s.size(), 2u);
  EXPECT_DOUBLE_EQ(s.busy_s[0], 60e-6);
  EXPECT_DOUBLE_EQ(s.busy_s[1], 26e-6);
  EXPECT_DOUBLE_EQ(s.bubble_ratio, 114.0 / 200.0);
  EXPECT_DOUBLE_EQ(s.comm_s[0], 1e-6);
  EXPECT_DOUBLE_EQ(s.comm_s[1], 28e-6);
}

// A batch's send and receive share one interval, and calls may overlap: the host's time in them
// counts once. One block [0, 100); calls [10, 30) twice and [20, 40): 30 in calls, 70 computing.
TEST(TraceSummary, OverlappingCallsCountOnce) {
  const TraceSummary s =
      summarize({{block("F s0 mb0", 0, 100), comm("send", 10, 30, 1, 5, 16),
                  comm("recv", 10, 30, 1, 6, 16), comm("recv", 20, 40, 1, 7, 16)}});
  EXPECT_DOUBLE_EQ(s.comm_s.at(0), 30e-6);
  EXPECT_DOUBLE_EQ(s.busy_s.at(0), 70e-6);
  EXPECT_DOUBLE_EQ(s.bubble_ratio, 0.3);
}

TEST(TraceSummary, LineNamesMeasuredAndPlanned) {
  const TraceSummary s = summarize(two_ranks());
  EstimateFigures plan;
  plan.bubble_ratio = 0.25;
  plan.step_s = 0.5;
  plan.comm_s = {0.001, 0.002};
  plan.cost_model = "cpu from t.yaml";
  EXPECT_EQ(summary_line(3, "out/trace_step_3.json", s, plan),
            "trace step 3 (out/trace_step_3.json): makespan 0.10 ms (plan step 500.00 ms), bubble "
            "57.0% (plan 25.0%); communication per rank: r0 0.00 ms (plan 1.00 ms), r1 0.03 ms "
            "(plan 2.00 ms); plan on cost model cpu from t.yaml");
  EXPECT_EQ(summary_line(3, "t.json", s, EstimateFigures{}),
            "trace step 3 (t.json): makespan 0.10 ms, bubble 57.0%; communication per rank: r0 "
            "0.00 ms, r1 0.03 ms");
}

// The layout of the plan's timeline.json: a process per rank, blocks on thread 0 named and
// tagged as the plan names them, communication on thread 1; times from the step's first event.
TEST(ChromeTrace, OneProcessPerRankComputeAndCommunicationThreads) {
  auto ranks = two_ranks();
  for (auto& events : ranks)
    for (auto& e : events) {
      e.start_us += 1000000;
      e.end_us += 1000000;
    }
  const auto doc = nlohmann::json::parse(to_chrome_trace(3, ranks, summarize(ranks)));
  EXPECT_EQ(doc["otherData"]["step"], 3);
  EXPECT_DOUBLE_EQ(doc["otherData"]["bubble_ratio"].get<double>(), 0.57);
  std::map<int, std::string> process;
  std::map<std::pair<int, int>, std::string> thread;
  std::vector<nlohmann::json> slices;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") process[e["pid"]] = e["args"]["name"];
    if (e["ph"] == "M" && e["name"] == "thread_name")
      thread[{e["pid"].get<int>(), e["tid"].get<int>()}] = e["args"]["name"];
    if (e["ph"] == "X") slices.push_back(e);
  }
  EXPECT_EQ(process, (std::map<int, std::string>{{0, "rank 0"}, {1, "rank 1"}}));
  EXPECT_EQ(thread[std::make_pair(1, 0)], "compute");
  EXPECT_EQ(thread[std::make_pair(1, 1)], "communication");
  ASSERT_EQ(slices.size(), 7u);
  EXPECT_EQ(slices[0]["name"], "F s0 mb0");
  EXPECT_EQ(slices[0]["cat"], "F");
  EXPECT_EQ(slices[0]["tid"], 0);
  EXPECT_EQ(slices[0]["ts"], 0);
  EXPECT_EQ(slices[0]["dur"], 30);
  EXPECT_EQ(slices[0]["args"]["stage"], 0);
  EXPECT_EQ(slices[0]["args"]["micro_batch"], 0);
  EXPECT_EQ(slices[1]["name"], "send");
  EXPECT_EQ(slices[1]["tid"], 1);
  EXPECT_EQ(slices[1]["args"]["peer"], 1);
  EXPECT_EQ(slices[1]["args"]["tag"], 5);
  EXPECT_EQ(slices[1]["args"]["bytes"], 16);
  EXPECT_EQ(slices[3]["pid"], 1);
  EXPECT_EQ(slices[3]["ts"], 10);
  EXPECT_FALSE(slices[6]["args"].contains("peer"));  // a collective
}

}  // namespace
}  // namespace loom::observe
