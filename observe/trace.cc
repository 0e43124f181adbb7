#include "observe/trace.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

namespace loom::observe {
namespace {

using nlohmann::json;

std::string milliseconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  return buf;
}

std::string percent(double ratio) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", ratio * 100);
  return buf;
}

json to_json(const TraceEvent& e) {
  return {{"name", e.name},      {"track", static_cast<int>(e.track)},
          {"start", e.start_us}, {"end", e.end_us},
          {"kind", e.kind},      {"stage", e.stage},
          {"mb", e.micro_batch}, {"peer", e.peer},
          {"tag", e.tag},        {"bytes", e.bytes},
          {"group", e.group}};
}

}  // namespace

bool TraceEvent::operator==(const TraceEvent& o) const {
  return name == o.name && track == o.track && start_us == o.start_us && end_us == o.end_us &&
         kind == o.kind && stage == o.stage && micro_batch == o.micro_batch && peer == o.peer &&
         tag == o.tag && bytes == o.bytes && group == o.group;
}

Tracer::Tracer()
    : steady_origin_(std::chrono::steady_clock::now()),
      system_origin_us_(std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count()) {}

int64_t Tracer::now_us() const {
  return system_origin_us_ + std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::steady_clock::now() - steady_origin_)
                                 .count();
}

TraceEvent comm_event(std::string name, int64_t peer, int64_t tag, int64_t bytes,
                      std::string group) {
  TraceEvent e;
  e.name = std::move(name);
  e.track = Track::kComm;
  e.peer = peer;
  e.tag = tag;
  e.bytes = bytes;
  e.group = std::move(group);
  return e;
}

std::string serialize(const std::vector<TraceEvent>& events) {
  json out = json::array();
  for (const TraceEvent& e : events) out.push_back(to_json(e));
  return out.dump();
}

Result<std::vector<TraceEvent>> parse_events(std::string_view bytes) {
  json in = json::parse(bytes, nullptr, false);
  if (in.is_discarded() || !in.is_array())
    return Error::at("logging.trace_steps", "a rank's trace events are not a JSON list");
  std::vector<TraceEvent> events;
  try {
    for (const json& j : in) {
      TraceEvent e;
      e.name = j.at("name").get<std::string>();
      e.track = j.at("track").get<int>() == 1 ? Track::kComm : Track::kCompute;
      e.start_us = j.at("start").get<int64_t>();
      e.end_us = j.at("end").get<int64_t>();
      e.kind = j.at("kind").get<std::string>();
      e.stage = j.at("stage").get<int64_t>();
      e.micro_batch = j.at("mb").get<int64_t>();
      e.peer = j.at("peer").get<int64_t>();
      e.tag = j.at("tag").get<int64_t>();
      e.bytes = j.at("bytes").get<int64_t>();
      e.group = j.at("group").get<std::string>();
      events.push_back(std::move(e));
    }
  } catch (const json::exception& ex) {
    return Error::at("logging.trace_steps",
                     std::string("a rank's trace event is malformed: ") + ex.what());
  }
  return events;
}

namespace {

using Interval = std::pair<int64_t, int64_t>;  // [start, end) in microseconds

// The union of `spans`, sorted: the events of one batch of sends and receives share one interval,
// and a rank's host spends that time once.
std::vector<Interval> merged(std::vector<Interval> spans) {
  std::sort(spans.begin(), spans.end());
  std::vector<Interval> out;
  for (const Interval& i : spans) {
    if (!out.empty() && i.first <= out.back().second)
      out.back().second = std::max(out.back().second, i.second);
    else
      out.push_back(i);
  }
  return out;
}

int64_t length_us(const std::vector<Interval>& spans) {
  int64_t total = 0;
  for (const auto& [start, end] : spans) total += end - start;
  return total;
}

// The microseconds of `comm` inside `blocks` (both sorted and disjoint).
int64_t overlap_us(const std::vector<Interval>& blocks, const std::vector<Interval>& comm) {
  int64_t total = 0;
  size_t b = 0;
  for (const auto& [start, end] : comm) {
    while (b < blocks.size() && blocks[b].second <= start) ++b;
    for (size_t k = b; k < blocks.size() && blocks[k].first < end; ++k)
      total +=
          std::max<int64_t>(0, std::min(end, blocks[k].second) - std::max(start, blocks[k].first));
  }
  return total;
}

}  // namespace

TraceSummary summarize(const std::vector<std::vector<TraceEvent>>& ranks) {
  TraceSummary s;
  int64_t first = std::numeric_limits<int64_t>::max(), last = std::numeric_limits<int64_t>::min();
  for (const auto& events : ranks) {
    std::vector<Interval> blocks, comm;
    for (const TraceEvent& e : events) {
      if (e.track == Track::kComm) {
        comm.emplace_back(e.start_us, e.end_us);
        continue;
      }
      blocks.emplace_back(e.start_us, e.end_us);
      first = std::min(first, e.start_us);
      last = std::max(last, e.end_us);
    }
    blocks = merged(std::move(blocks));
    comm = merged(std::move(comm));
    s.busy_s.push_back(static_cast<double>(length_us(blocks) - overlap_us(blocks, comm)) * 1e-6);
    s.comm_s.push_back(static_cast<double>(length_us(comm)) * 1e-6);
  }
  if (last <= first || ranks.empty()) return s;
  s.makespan_s = static_cast<double>(last - first) * 1e-6;
  double idle = 0;
  for (double b : s.busy_s) idle += std::max(0.0, s.makespan_s - b);
  s.bubble_ratio = idle / (static_cast<double>(ranks.size()) * s.makespan_s);
  return s;
}

std::string summary_line(int64_t step, const std::string& file, const TraceSummary& measured,
                         const EstimateFigures& estimate) {
  std::string line = "trace step " + std::to_string(step) + " (" + file + "): makespan " +
                     milliseconds(measured.makespan_s);
  if (!estimate.empty()) line += " (plan step " + milliseconds(estimate.step_s) + ")";
  line += ", bubble " + percent(measured.bubble_ratio);
  if (!estimate.empty()) line += " (plan " + percent(estimate.bubble_ratio) + ")";
  line += "; communication per rank:";
  for (size_t r = 0; r < measured.comm_s.size(); ++r) {
    line += (r ? ", r" : " r") + std::to_string(r) + " " + milliseconds(measured.comm_s[r]);
    if (r < estimate.comm_s.size()) line += " (plan " + milliseconds(estimate.comm_s[r]) + ")";
  }
  if (!estimate.empty() && !estimate.cost_model.empty())
    line += "; plan on cost model " + estimate.cost_model;
  return line;
}

std::string to_chrome_trace(int64_t step, const std::vector<std::vector<TraceEvent>>& ranks,
                            const TraceSummary& summary) {
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const auto& events : ranks)
    for (const TraceEvent& e : events) origin = std::min(origin, e.start_us);
  json events = json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const int pid = static_cast<int>(r);
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"tid", 0},
                      {"args", {{"name", "rank " + std::to_string(r)}}}});
    events.push_back({{"name", "process_sort_index"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"tid", 0},
                      {"args", {{"sort_index", pid}}}});
    for (const auto& [tid, name] :
         {std::pair<int, const char*>{0, "compute"}, {1, "communication"}})
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", pid},
                        {"tid", tid},
                        {"args", {{"name", name}}}});
    for (const TraceEvent& e : ranks[r]) {
      json slice = {{"name", e.name},
                    {"ph", "X"},
                    {"pid", pid},
                    {"tid", static_cast<int>(e.track)},
                    {"ts", e.start_us - origin},
                    {"dur", e.end_us - e.start_us}};
      if (e.track == Track::kCompute) {
        slice["cat"] = e.kind;
        slice["args"] = {{"stage", e.stage}, {"micro_batch", e.micro_batch}, {"kind", e.kind}};
      } else {
        slice["cat"] = "comm";
        json args = {{"bytes", e.bytes}};
        if (e.peer >= 0) args["peer"] = e.peer;
        if (e.tag >= 0) args["tag"] = e.tag;
        if (!e.group.empty()) args["group"] = e.group;
        slice["args"] = std::move(args);
      }
      events.push_back(std::move(slice));
    }
  }
  json doc = {{"traceEvents", events},
              {"displayTimeUnit", "ms"},
              {"otherData",
               {{"step", step},
                {"measured", true},
                {"makespan_s", summary.makespan_s},
                {"bubble_ratio", summary.bubble_ratio},
                {"comm_s", summary.comm_s},
                {"busy_s", summary.busy_s}}}};
  return doc.dump(1) + "\n";
}

}  // namespace loom::observe
