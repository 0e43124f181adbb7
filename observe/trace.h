// Measured traces of training steps (logging.trace_steps): each rank's Tracer records what its
// program did during a step, every block and every communication call with its start and end;
// rank 0 merges the ranks' events into one chrome trace laid out as `loom plan`'s estimated
// timeline.json (scheduler/render.h, plan/plan.cc), so the two open side by side in Perfetto,
// and sums them up against the plan's estimate. LibTorch-free: the runtime hands in names and
// sizes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace loom::observe {

// The chrome-trace thread an event is drawn on, as in the plan's timeline.json: blocks on
// thread 0, communication on thread 1.
enum class Track { kCompute = 0, kComm = 1 };

struct TraceEvent {
  std::string name;  // a block: "F s1 mb3" (the plan's name); communication: "send", "all_reduce"
  Track track = Track::kCompute;
  int64_t start_us = 0, end_us = 0;  // on the Tracer's clock
  // A block: its kind letter (F, B, I, W), stage and micro-batch.
  std::string kind;
  int64_t stage = -1, micro_batch = -1;
  // Communication: the peer's world rank and the message tag of a send or receive (-1 for a
  // collective), the bytes this rank hands over, and the group ("tp[0,1]").
  int64_t peer = -1, tag = -1, bytes = 0;
  std::string group;

  bool operator==(const TraceEvent& o) const;
};

// One rank's recording of one step. Its clock is common to every rank: microseconds of the
// system clock (which hosts keep in step, and which ranks on one machine share) read once when
// the Tracer is made, advanced by the steady clock, so times within a rank never go backwards.
class Tracer {
 public:
  Tracer();
  int64_t now_us() const;
  void add(TraceEvent event) { events_.push_back(std::move(event)); }
  const std::vector<TraceEvent>& events() const { return events_; }

  // Called before each time is read (on a GPU: wait for the device's queued work, so a block's
  // end is when its kernels finished, not when they were queued). Unset: nothing.
  void set_sync(std::function<void()> sync) { sync_ = std::move(sync); }
  void sync() const {
    if (sync_) sync_();
  }

 private:
  std::chrono::steady_clock::time_point steady_origin_;
  int64_t system_origin_us_ = 0;
  std::function<void()> sync_;
  std::vector<TraceEvent> events_;
};

// Times what happens between its construction and its destruction as the event `make()`
// returns, on `tracer`; when `tracer` is null it does nothing, not even make the event (tracing
// off costs this one check).
class TraceSpan {
 public:
  template <class Make>
  TraceSpan(Tracer* tracer, Make&& make) : tracer_(tracer) {
    if (!tracer_) return;
    event_ = make();
    tracer_->sync();
    event_.start_us = tracer_->now_us();
  }
  ~TraceSpan() {
    if (!tracer_) return;
    tracer_->sync();
    event_.end_us = tracer_->now_us();
    tracer_->add(std::move(event_));
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  Tracer* tracer_;
  TraceEvent event_;
};

// A communication event (the helper the runtime's hooks share).
TraceEvent comm_event(std::string name, int64_t peer, int64_t tag, int64_t bytes,
                      std::string group);

// The events of one rank as bytes (sent to rank 0 over the world Comm) and back.
std::string serialize(const std::vector<TraceEvent>& events);
Result<std::vector<TraceEvent>> parse_events(std::string_view bytes);

// What a traced step measured. Makespan: from the first block's start to the last block's end
// over every rank. A rank computes in its blocks, less the communication calls inside them (a
// block waiting for its input, or on a collective, computes nothing); its bubble is the rest of
// the makespan, and the step's bubble ratio is their mean (the plan's definition: idle
// device-time over devices x makespan, where a device waiting for a message is idle).
// Communication: the time the rank's host spent in communication calls (blocked in receives and
// collectives, starting sends, waiting for buckets), inside blocks or not, each moment once (a
// batch's sends and receives share their interval).
struct TraceSummary {
  double makespan_s = 0;
  double bubble_ratio = 0;
  std::vector<double> busy_s;  // per rank: computing (in blocks, not in a call)
  std::vector<double> comm_s;  // per rank
};
TraceSummary summarize(const std::vector<std::vector<TraceEvent>>& ranks);

// The plan's figures a measured step is read against (plan/estimate.h): empty when the run has
// no estimate (a plan read from plan.json).
struct EstimateFigures {
  double bubble_ratio = 0;
  double step_s = 0;
  std::vector<double> comm_s;  // per rank
  std::string cost_model;      // CostModel::name: what the figures assume ("cpu from ...")
  bool empty() const { return comm_s.empty(); }
};

// "trace step 3 (trace_step_3.json): makespan 41.20 ms (plan step 38.00 ms), bubble 23.4% (plan
// 20.0%); communication per rank: r0 5.10 ms (plan 3.20 ms), ...; plan on cost model cpu from
// the built-in configs/cost-model.yaml".
std::string summary_line(int64_t step, const std::string& file, const TraceSummary& measured,
                         const EstimateFigures& estimate);

// The merged chrome trace: one process per rank ("rank 2"), thread 0 "compute" with one slice
// per block named and tagged as in the plan's timeline.json, thread 1 "communication" with one
// slice per call; times in microseconds from the step's first event. `otherData` holds the step
// and the summary.
std::string to_chrome_trace(int64_t step, const std::vector<std::vector<TraceEvent>>& ranks,
                            const TraceSummary& summary);

}  // namespace loom::observe
